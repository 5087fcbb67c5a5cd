package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/turnguard/turnguard/store"
)

// TestSecondOpenOfTheSameStoreRefused: while one SQLite holds a store file,
// another Open of it fails at once with *InUseError naming the file and the
// holder's pid, without touching the database; once the first is closed the
// file opens again. ":memory:" stores take no lock.
func TestSecondOpenOfTheSameStoreRefused(t *testing.T) {
	path := dbPath(t)
	first, err := store.Open(context.Background(), path, store.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	_, err = store.Open(context.Background(), path, store.Options{Logger: quiet})
	var inUse *store.InUseError
	if !errors.As(err, &inUse) || inUse.PID != os.Getpid() {
		t.Fatalf("second Open = %v, want an *InUseError with pid %d", err, os.Getpid())
	}
	if want := fmt.Sprintf("another gateway is using turnguard.db (pid %d)", os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Errorf("second Open = %q, want it to contain %q", err, want)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	open(t, path, store.Options{})

	open(t, ":memory:", store.Options{})
	open(t, ":memory:", store.Options{})
}

// TestCleanCloseRemovesTheLockFile: the lock file exists while a store is
// open and is gone after a clean Close (issue 22: turnguard.db.lock stayed
// after a clean shutdown); the store opens again after it.
func TestCleanCloseRemovesTheLockFile(t *testing.T) {
	path := dbPath(t)
	s, err := store.Open(context.Background(), path, store.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".lock"); err != nil {
		t.Fatalf("no lock file while open: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".lock"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the lock file is still there after a clean Close (stat: %v)", err)
	}
	again, err := store.Open(context.Background(), path, store.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Open(context.Background(), path, store.Options{Logger: quiet}); !errors.As(err, new(*store.InUseError)) {
		t.Errorf("a second Open after reopening = %v, want *InUseError", err)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
}
