package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/store/postgres"
	"github.com/turnguard/turnguard/store/storetest"
)

// A batch commits durably when it wrote what only the recorder keeps or
// what the outbox owes; in shared mode a batch that wrote only a claimed
// turn's shadows (its limits, steps, journal; its ending, which its owner's
// Finish recorded) commits without waiting for the write-ahead log's flush
// (issue 21). The test server's synchronous_commit is on.
func TestBatchCommitsDurablyOnlyWhenItMust(t *testing.T) {
	ctx := context.Background()
	sharedURL := pgtest.New(t)
	c := connect(t, sharedURL)
	cases := []struct {
		name    string
		shared  bool
		claimed bool   // the turn's row was written by a claim (cluster/pgcoord)
		ended   bool   // and its owner's Finish ended it before the recorder wrote its start
		channel string // telegram is an outbox channel
		batches [][]event.Kind
		want    []string // synchronous_commit of each batch
	}{
		{"claimed turn", true, true, false, "telegram",
			[][]event.Kind{{event.TurnStarted, event.StepStarted, event.StepCompleted}, {event.Finished}}, []string{"off", "off"}},
		{"claimed turn ended before its start was written", true, true, true, "telegram",
			[][]event.Kind{{event.TurnStarted, event.StepStarted}, {event.Finished}}, []string{"off", "off"}},
		{"claimed turn's ending, its start unseen", true, true, false, "telegram",
			[][]event.Kind{{event.Finished}}, []string{"on"}},
		{"unclaimed turn", true, false, false, "ws",
			[][]event.Kind{{event.TurnStarted}, {event.StepStarted}, {event.Finished}}, []string{"on", "off", "on"}},
		{"unclaimed turn of an outbox channel", true, false, false, "telegram",
			[][]event.Kind{{event.TurnStarted, event.Finished}}, []string{"on"}},
		{"one gateway", false, false, false, "ws",
			[][]event.Kind{{event.TurnStarted, event.StepStarted}, {event.Finished}}, []string{"on", "on"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url := sharedURL
			if !tc.shared {
				url = pgtest.New(t) // one gateway holds its database
			}
			var got []string
			s := open(t, url, postgres.WithCommitCheck(postgres.Options{Shared: tc.shared, OutboxChannels: []string{"telegram"}},
				func(mode string) { got = append(got, mode) }))
			tr := storetest.NewTurn(fmt.Sprintf("run-%d", i), fmt.Sprintf("%s:%d", tc.channel, i))
			tr.Channel = tc.channel
			if tc.claimed {
				if _, err := c.Exec(ctx, `WITH s AS (INSERT INTO sessions (key, created_at, updated_at) VALUES ($1, now(), now()))
					INSERT INTO turns (run_id, session_key, channel, chat_ref, state, started_at, updated_at, owner_replica, owner_epoch)
					VALUES ($2, $1, $3, $4, $5, now(), now(), 'r1', 1)`, tr.Session, tr.Run, tr.Channel, tr.Chat, state(tc.ended)); err != nil {
					t.Fatal(err)
				}
			}
			for _, kinds := range tc.batches {
				var evs []event.Event
				for _, kind := range kinds {
					st := storetest.Step("tool", "shell", 1, 0)
					evs = append(evs, tr.Ev(kind, 0, func(e *event.Event) {
						e.Text, e.FullText, e.StopReason = "hi", "done", event.ReasonStop
						if kind == event.StepStarted || kind == event.StepCompleted {
							e.Step = st
						}
					}))
				}
				if err := postgres.WriteBatch(ctx, s, evs); err != nil {
					t.Fatal(err)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("synchronous_commit of the batches: %q, want %q", got, tc.want)
			}
			if tc.claimed {
				// The recorder never ends nor restarts a claimed turn: its
				// owner does.
				var got string
				if err := c.QueryRow(ctx, `SELECT state FROM turns WHERE run_id = $1`, tr.Run).Scan(&got); err != nil || got != state(tc.ended) {
					t.Errorf("the claimed turn's state: %q (%v), want %s", got, err, state(tc.ended))
				}
			}
		})
	}
}

// state is a claimed turn's state: finished when ended, else running.
func state(ended bool) string {
	if ended {
		return "finished"
	}
	return "running"
}
