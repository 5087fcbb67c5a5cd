package store_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/storetest"
)

// The SQLite store passes the conformance suite every store passes; the
// tests beside it here are SQLite's own (its file, lock, disk, migrations)
// and the shared recorder's machinery, tested through SQLite.
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Factory{
		New: func(t *testing.T) string { return dbPath(t) },
		Open: func(ctx context.Context, path string, c storetest.Config) (store.Backend, error) {
			return store.Open(ctx, path, store.WithCommitHooks(store.Options{Logger: quiet, OutboxChannels: c.OutboxChannels,
				OnOutbox: c.OnOutbox, Retention: c.Retention, BatchSize: c.BatchSize, Unlocked: c.SecondProcess},
				c.BeforeCommit, c.AfterCommit))
		},
	})
}

// The suite's helpers, under the names these tests use.
var (
	t0          = storetest.T0
	quiet       = storetest.Quiet
	newTurn     = storetest.NewTurn
	step        = storetest.Step
	msgs        = storetest.Msgs
	queuedTexts = storetest.QueuedTexts
	eqStrings   = storetest.EqStrings
	keepDays    = storetest.KeepDays
)

type msg = storetest.Msg

// dbPath is a fresh database file in the test's temp dir.
func dbPath(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "turnguard.db")
}

// open opens the store at path and closes it at the end of the test.
func open(t testing.TB, path string, opts store.Options) *store.SQLite {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	s, err := store.Open(context.Background(), path, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func flush(t testing.TB, s *store.SQLite) { t.Helper(); storetest.Flush(t, s) }

func handleAll(s *store.SQLite, evs ...event.Event) { storetest.HandleAll(s, evs...) }

func mustHistory(t testing.TB, s *store.SQLite, session string) []store.Message {
	t.Helper()
	return storetest.MustHistory(t, s, session)
}

func mustTurn(t testing.TB, s *store.SQLite, run string) store.Turn {
	t.Helper()
	return storetest.MustTurn(t, s, run)
}
