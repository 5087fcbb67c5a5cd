package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/store/postgres"
	"github.com/turnguard/turnguard/store/storetest"
)

// A batch's step events, folded into one update per run, leave the turn's
// row as the same events written one batch each: the current step (cleared
// only by the completion of that step) and the last completed one.
func TestFoldedStepsMatchOneEventAtATime(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	s := open(t, url, postgres.Options{})
	c := connect(t, url)
	type step struct {
		started bool
		seq     uint32
	}
	cases := []struct {
		name  string
		prior []step // written before, one batch each
		batch []step
	}{
		{"start and complete", nil, []step{{true, 1}, {false, 1}}},
		{"a later step still running", nil, []step{{true, 1}, {true, 2}, {false, 1}}},
		{"completes the row's step", []step{{true, 1}}, []step{{false, 1}}},
		{"completes another step", []step{{true, 1}}, []step{{false, 2}}},
		{"two completions, the second the row's", []step{{true, 2}}, []step{{false, 1}, {false, 2}}},
		{"two completions, neither the row's", []step{{true, 3}}, []step{{false, 1}, {false, 2}}},
		{"a whole turn's steps", nil, []step{{true, 1}, {false, 1}, {true, 2}, {false, 2}, {true, 3}}},
		{"completion then start", []step{{true, 1}}, []step{{false, 1}, {true, 2}, {false, 9}}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			row := func(run string, batched bool) string {
				tr := storetest.NewTurn(run, fmt.Sprintf("ws:%d", i))
				at := time.Duration(0)
				ev := func(st step) event.Event {
					at += time.Second
					k := event.StepCompleted
					if st.started {
						k = event.StepStarted
					}
					return tr.Ev(k, at, func(e *event.Event) { e.Step = storetest.Step("tool", fmt.Sprint("s", st.seq), st.seq, at) })
				}
				write := func(evs ...event.Event) {
					t.Helper()
					if err := postgres.WriteBatch(ctx, s, evs); err != nil {
						t.Fatal(err)
					}
				}
				write(tr.Ev(event.TurnStarted, 0, nil))
				for _, st := range tc.prior {
					write(ev(st))
				}
				var evs []event.Event
				for _, st := range tc.batch {
					evs = append(evs, ev(st))
				}
				if batched {
					write(evs...)
				} else {
					for _, e := range evs {
						write(e)
					}
				}
				var got string
				if err := c.QueryRow(ctx, `SELECT concat_ws(' ', coalesce(step_kind, '-'), coalesce(step_name, '-'), coalesce(step_seq::text, '-'),
						coalesce(last_step_kind, '-'), coalesce(last_step_name, '-'), coalesce(last_step_seq::text, '-'), updated_at)
					FROM turns WHERE run_id = $1`, run).Scan(&got); err != nil {
					t.Fatal(err)
				}
				return got
			}
			one, folded := row(fmt.Sprintf("one-%d", i), false), row(fmt.Sprintf("folded-%d", i), true)
			if one != folded {
				t.Errorf("folded: %s\none event at a time: %s", folded, one)
			}
		})
	}
}
