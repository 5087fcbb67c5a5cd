package store_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

func TestMigrateEmptyFileToLatest(t *testing.T) {
	ctx := context.Background()
	path := dbPath(t)
	s := open(t, path, store.Options{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	v, err := store.UserVersion(ctx, path)
	if err != nil || v != store.SchemaVersion || v < 2 {
		t.Fatalf("schema version = %d, %v; want %d (at least 2)", v, err, store.SchemaVersion)
	}
	if mode, err := store.JournalMode(ctx, path); mode != "wal" {
		t.Errorf("journal mode = %q, %v; want wal", mode, err)
	}
	// Reopening an up-to-date file changes nothing.
	open(t, path, store.Options{}).Close()
	if v2, _ := store.UserVersion(ctx, path); v2 != v {
		t.Errorf("schema version after reopen = %d, want %d", v2, v)
	}
}

// Version 1 is the previous schema version. When a version is added, add a
// fixture of the then-previous version and a test like this one.
func TestMigrateFromVersion1KeepsRows(t *testing.T) {
	ctx := context.Background()
	path := dbPath(t)
	if err := store.CreateAtVersion(ctx, path, 1); err != nil {
		t.Fatalf("create at version 1: %v", err)
	}
	fixture, err := os.ReadFile("testdata/v1_rows.sql")
	if err != nil {
		t.Fatal(err)
	}
	if err := store.ExecFile(ctx, path, string(fixture)); err != nil {
		t.Fatalf("load fixture: %v", err)
	}

	s := open(t, path, store.Options{})
	if v, _ := store.UserVersion(ctx, path); v != store.SchemaVersion {
		t.Errorf("schema version = %d, want %d", v, store.SchemaVersion)
	}
	want := []msg{
		{Role: store.RoleUser, Text: "What is the capital of France?", StopReason: ""},
		{Role: store.RoleAssistant, Text: "Paris.", StopReason: event.ReasonStop},
		{Role: store.RoleUser, Text: "Find me flights to Paris.", StopReason: ""},
	}
	if got := msgs(mustHistory(t, s, "telegram:42")); !slices.Equal(got, want) {
		t.Errorf("history = %q, want %q", got, want)
	}
	old := mustTurn(t, s, "run-old-1")
	if old.State != store.TurnFinished || !old.StartedAt.Equal(t0) || old.LastStep.Name != "gpt-4o" || !old.Deadline.IsZero() {
		t.Errorf("migrated turn = %+v", old)
	}
	running, err := s.RunningTurns(ctx)
	if err != nil || len(running) != 1 || running[0].RunID != "run-old-2" || running[0].CurrentStep.Name != "web_search" {
		t.Fatalf("RunningTurns = %+v, %v; want run-old-2 in web_search", running, err)
	}

	// What version 2 added works on the migrated file: interruption
	// recovery journals, the outbox stores.
	if ok, err := s.MarkInterrupted(ctx, "run-old-2", "⚠️ restarted"); !ok || err != nil {
		t.Fatalf("MarkInterrupted = %v, %v", ok, err)
	}
	if _, err := s.Enqueue(ctx, store.OutboxMessage{Channel: "telegram", ChatRef: "42", RunID: "run-old-2",
		Kind: store.OutboxNotice, Text: "⚠️ restarted"}); err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	tr := newTurn("run-new", "telegram:42")
	handleAll(s, tr.Ev(event.TurnStarted, time.Hour, func(e *event.Event) { e.Text = "and hotels?" }))
	flush(t, s)
	if got := len(mustHistory(t, s, "telegram:42")); got != 5 {
		t.Errorf("history has %d messages, want 5", got)
	}
	j, err := s.Journal(ctx, store.Filter{SessionKey: "telegram:42"})
	if err != nil || len(j) != 2 {
		t.Errorf("journal = %+v, %v; want the interruption and the new start", j, err)
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	path := dbPath(t)
	open(t, path, store.Options{}).Close()
	if err := store.ExecFile(ctx, path, "PRAGMA user_version = 99"); err != nil {
		t.Fatal(err)
	}
	_, err := store.Open(ctx, path, store.Options{Logger: quiet})
	if !errors.Is(err, store.ErrSchemaTooNew) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open of a newer schema = %v, want ErrSchemaTooNew naming the file", err)
	}
	if v, _ := store.UserVersion(ctx, path); v != 99 {
		t.Errorf("schema version = %d: the newer file was changed", v)
	}
}

func TestOpenRefusesNonDatabase(t *testing.T) {
	path := dbPath(t)
	junk := bytes.Repeat([]byte("this is not a database\n"), 200)
	if err := os.WriteFile(path, junk, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := store.Open(context.Background(), path, store.Options{Logger: quiet})
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open of a text file = %v, want an error naming it", err)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(after, junk) {
		t.Errorf("the file was modified")
	}
}

func TestOpenRefusesAnotherApplicationsDatabase(t *testing.T) {
	ctx := context.Background()
	path := dbPath(t)
	if err := store.ExecFile(ctx, path, "CREATE TABLE contacts (name TEXT); INSERT INTO contacts VALUES ('Ada')"); err != nil {
		t.Fatal(err)
	}
	_, err := store.Open(ctx, path, store.Options{Logger: quiet})
	if err == nil || !strings.Contains(err.Error(), "not a turnguard database") || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open of another application's database = %v, want a refusal naming it", err)
	}
	if v, _ := store.UserVersion(ctx, path); v != 0 {
		t.Errorf("schema version = %d: the file was migrated", v)
	}
	if mode, _ := store.JournalMode(ctx, path); mode != "delete" {
		t.Errorf("journal mode = %q: the file was switched from delete", mode)
	}
}

// openMigrated creates a database at schema version v, loads the v1 rows
// fixture into it (later versions only added tables, columns and indexes),
// opens it (which migrates it) and checks its version and history.
func openMigrated(t *testing.T, v int) *store.SQLite {
	t.Helper()
	ctx := context.Background()
	path := dbPath(t)
	if err := store.CreateAtVersion(ctx, path, v); err != nil {
		t.Fatalf("create at version %d: %v", v, err)
	}
	fixture, err := os.ReadFile("testdata/v1_rows.sql")
	if err != nil {
		t.Fatal(err)
	}
	if err := store.ExecFile(ctx, path, string(fixture)); err != nil {
		t.Fatalf("load fixture: %v", err)
	}
	s := open(t, path, store.Options{})
	if got, _ := store.UserVersion(ctx, path); got != store.SchemaVersion {
		t.Errorf("schema version = %d, want %d", got, store.SchemaVersion)
	}
	if got := mustHistory(t, s, "telegram:42"); len(got) != 3 {
		t.Fatalf("history after migration from v%d = %+v, want the 3 stored messages", v, got)
	}
	return s
}

// Version 2 is the previous schema version since v3 (session reset): its
// rows survive the migration, and a reset works on the migrated file.
func TestMigrateFromVersion2KeepsRowsAndResets(t *testing.T) {
	s := openMigrated(t, 2)
	s.Handle(event.Event{Kind: event.SessionReset, SessionKey: "telegram:42", Time: t0.Add(time.Hour)})
	flush(t, s)
	if got := mustHistory(t, s, "telegram:42"); len(got) != 0 {
		t.Fatalf("history after a reset on the migrated file = %+v, want none", got)
	}
}
