package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/postgres"
	"github.com/turnguard/turnguard/store/storetest"
)

// TestRecoverInterruptedExpiresApprovals: the previous process stopped
// with a turn waiting on a question and a question whose turn was never
// recorded; the start-up recovery ends the turn as interrupted and both
// questions read back expired, not answered.
func TestRecoverInterruptedExpiresApprovals(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	for _, tc := range reopeners(quiet) {
		t.Run(tc.name, func(t *testing.T) {
			open := tc.open(t)
			s := open()
			tr := storetest.NewTurn("run-1", "telegram:42")
			storetest.HandleAll(s,
				tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "deploy" }),
				tr.Ev(event.ApprovalRequested, time.Second, func(e *event.Event) { e.Approval = storetest.Approval("ap_1") }),
				storetest.NewTurn("run-gone", "telegram:42").Ev(event.ApprovalRequested, time.Second, func(e *event.Event) {
					e.Approval = storetest.Approval("ap_2")
				}))
			storetest.Flush(t, s)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}

			s = open()
			recoverInterrupted(context.Background(), s, config.Default(), quiet, nil)
			if got := storetest.MustTurn(t, s, "run-1"); got.StopReason != event.ReasonInterrupted {
				t.Errorf("turn after recovery: %s %s, want interrupted", got.State, got.StopReason)
			}
			for _, id := range []string{"ap_1", "ap_2"} {
				a := storetest.MustApproval(t, s, id)
				if a.Status != event.ApprovalExpired || a.AnsweredBy != "" || a.OptionID != "" || a.ResolvedAt.IsZero() {
					t.Errorf("%s after recovery = %+v, want expired, unanswered", id, storetest.StateOf(a))
				}
			}
		})
	}
}

// reopener opens a fresh store of one backend; each call of the function
// it returns opens that same store anew (a restart).
type reopener struct {
	name string
	open func(t *testing.T) func() store.Backend
}

// reopeners are SQLite (a file) and PostgreSQL (a database), logging to log.
func reopeners(log *slog.Logger) []reopener {
	return []reopener{
		{"sqlite", func(t *testing.T) func() store.Backend {
			path := filepath.Join(t.TempDir(), "turnguard.db")
			return func() store.Backend {
				s, err := store.Open(context.Background(), path, store.Options{Logger: log, OutboxChannels: []string{"telegram"}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Close() })
				return s
			}
		}},
		{"postgres", func(t *testing.T) func() store.Backend {
			url := pgtest.New(t)
			return func() store.Backend {
				s, err := postgres.Open(context.Background(), url, postgres.Options{Logger: log, OutboxChannels: []string{"telegram"}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Close() })
				return s
			}
		}},
	}
}
