package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/faketime"
	"github.com/turnguard/turnguard/store"
)

// healthLog records the OnHealth transitions.
type healthLog struct {
	mu  sync.Mutex
	got []error
}

func (h *healthLog) note(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got = append(h.got, err)
}

func (h *healthLog) transitions() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, e := range h.got {
		if e == nil {
			out = append(out, "recovered")
		} else {
			out = append(out, "unwritable")
		}
	}
	return out
}

// TestDiskFullKeepsEndingsAndRecovers fills the database (SQLite's real
// SQLITE_FULL through max_page_count) while a turn runs: the store reports
// itself unwritable (once), keeps the turn's ending and retries it with
// backoff, and by itself writes it and reports healthy once space returns.
func TestDiskFullKeepsEndingsAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hl healthLog
		var attempts atomic.Int64 // batch writes tried
		s := open(t, dbPath(t), store.WithBeforeBatch(store.Options{OnHealth: hl.note}, func() { attempts.Add(1) }))
		ctx := context.Background()
		tr := newTurn("run-1", "s")
		s.Handle(tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "q" }))
		flush(t, s)
		if err := s.Health(); err != nil {
			t.Fatalf("Health before the disk fills = %v", err)
		}

		if _, err := store.LimitPages(s, 0); err != nil {
			t.Fatal(err)
		}
		reply := strings.Repeat("a long reply ", 20000) // ~260 KB: needs new pages
		s.Handle(tr.Ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, reply }))
		synctest.Wait()
		err := s.Health()
		var uw *store.UnwritableError
		if !errors.Is(err, store.ErrUnwritable) || !errors.As(err, &uw) || !strings.Contains(uw.Reason, "full") {
			t.Fatalf("Health with a full database = %v, want ErrUnwritable saying it is full", err)
		}
		if _, err := s.Enqueue(ctx, store.OutboxMessage{Channel: "telegram", ChatRef: "42", RunID: "run-1",
			Kind: store.OutboxFinal, Text: reply}); err == nil {
			t.Errorf("Enqueue of a big message into a full database succeeded")
		}

		// A minute of retries: still full, nothing lost, nothing failed; the
		// retries back off (0.1 s doubling to 5 s: 6 tries in the first
		// 6.3 s, then one each 5 s), they do not spin.
		before := attempts.Load()
		faketime.Advance(time.Minute)
		synctest.Wait()
		if n := attempts.Load() - before; n < 12 || n > 20 {
			t.Errorf("%d write attempts in a minute of a full disk, want 12–20 (backoff up to 5 s)", n)
		}
		if got := mustTurn(t, s, "run-1").State; got != store.TurnRunning {
			t.Errorf("turn state while full = %s (the ending cannot have been written)", got)
		}
		if st := s.Stats(); st.Failed != 0 || st.Dropped != 0 || st.QueueDepth != 0 {
			t.Errorf("stats while full = %+v: the ending must be kept for a retry, not failed or dropped", st)
		}
		if s.Health() == nil {
			t.Errorf("Health while still full = nil")
		}

		// Space returns: the next retry writes the ending.
		if _, err := store.LimitPages(s, 1<<30); err != nil {
			t.Fatal(err)
		}
		faketime.Advance(10 * time.Second)
		synctest.Wait()
		flush(t, s)
		if err := s.Health(); err != nil {
			t.Errorf("Health after space returned = %v, want nil", err)
		}
		if got := mustTurn(t, s, "run-1"); got.State != store.TurnFinished {
			t.Errorf("turn after recovery = %s, want finished", got.State)
		}
		if h := mustHistory(t, s, "s"); len(h) != 2 || h[1].Text != reply {
			t.Errorf("history after recovery has %d messages, want the question and the whole reply", len(h))
		}
		if got := hl.transitions(); len(got) != 2 || got[0] != "unwritable" || got[1] != "recovered" {
			t.Errorf("OnHealth transitions = %v, want [unwritable recovered]", got)
		}
	})
}

// TestOutboxFailureAloneIsProbedBack: a failed synchronous write (an outbox
// Enqueue into a full database) makes the store unwritable even when no
// event is queued, and the writer's probe finds by itself that space
// returned.
func TestOutboxFailureAloneIsProbedBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hl healthLog
		s := open(t, dbPath(t), store.Options{OnHealth: hl.note})
		if _, err := store.LimitPages(s, 0); err != nil {
			t.Fatal(err)
		}
		big := strings.Repeat("x", 200<<10)
		if _, err := s.Enqueue(context.Background(), store.OutboxMessage{Channel: "telegram", ChatRef: "1", RunID: "r",
			Kind: store.OutboxNotice, Text: big}); err == nil {
			t.Fatal("Enqueue into a full database succeeded")
		}
		synctest.Wait()
		if s.Health() == nil {
			t.Fatal("Health after a failed Enqueue = nil")
		}
		faketime.Advance(time.Minute)
		synctest.Wait()
		if s.Health() == nil {
			t.Fatal("Health while still full = nil")
		}
		if _, err := store.LimitPages(s, 1<<30); err != nil {
			t.Fatal(err)
		}
		faketime.Advance(3 * time.Second) // one check interval
		synctest.Wait()
		if err := s.Health(); err != nil {
			t.Errorf("Health after space returned = %v, want nil", err)
		}
		if got := hl.transitions(); len(got) != 2 {
			t.Errorf("OnHealth transitions = %v, want [unwritable recovered]", got)
		}
	})
}

// TestDeletedFileIsRecreated deletes the database file under a running
// store: the store notices within a check interval, recreates the file from
// the open copy with everything written so far (history, a running turn, a
// pending outbox row), writes what came after into the new file, and
// reports the episode (unwritable, then recovered).
//
// Deleting only the .db file leaves its -wal behind, which SQLite would
// replay into the recreated file (old pages over new data) if it were not
// removed first.
func TestDeletedFileIsRecreated(t *testing.T) {
	for _, tc := range []struct {
		name    string
		deleted []string
	}{
		{"db, wal and shm deleted", []string{"", "-wal", "-shm"}},
		{"only the db deleted", []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) { synctest.Test(t, func(t *testing.T) { deletedFileIsRecreated(t, tc.deleted) }) })
	}
}

func deletedFileIsRecreated(t *testing.T, deleted []string) {
	var hl healthLog
	path := dbPath(t)
	s := open(t, path, store.Options{OnHealth: hl.note, Retention: store.Retention{History: time.Hour, BatchRows: 1000}})
	ctx := context.Background()
	// Pages freed by a prune, so the recreated (compacted) file's layout
	// differs from the deleted one's.
	for i := range 100 {
		junk := newTurn(fmt.Sprint("junk-", i), fmt.Sprint("junk-", i))
		handleAll(s, junk.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = strings.Repeat("j", 2000) }),
			junk.Ev(event.Finished, 0, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, strings.Repeat("k", 2000) }))
	}
	flush(t, s)
	if _, err := s.Prune(ctx, t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	done, running := newTurn("done", "s"), newTurn("running", "s2")
	handleAll(s,
		done.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "q1" }),
		done.Ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "a1" }),
		running.Ev(event.TurnStarted, 2*time.Second, func(e *event.Event) { e.Text = "q2" }),
	)
	flush(t, s)
	if _, err := s.Enqueue(ctx, store.OutboxMessage{Channel: "telegram", ChatRef: "42", RunID: "done",
		Kind: store.OutboxFinal, Text: "a1"}); err != nil {
		t.Fatal(err)
	}

	for _, suffix := range deleted {
		if err := os.Remove(path + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	// Written after the deletion, before the check notices it.
	s.Handle(running.Ev(event.Finished, 3*time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "a2" }))
	flush(t, s)

	faketime.Advance(3 * time.Second) // one check interval
	synctest.Wait()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database file after a check interval: %v, want it recreated", err)
	}
	if err := s.Health(); err != nil {
		t.Errorf("Health after recreating = %v", err)
	}
	if got := hl.transitions(); len(got) != 2 || got[0] != "unwritable" || got[1] != "recovered" {
		t.Errorf("OnHealth transitions = %v, want [unwritable recovered] (an alert and its recovery)", got)
	}
	later := newTurn("later", "s")
	handleAll(s,
		later.Ev(event.TurnStarted, 4*time.Second, func(e *event.Event) { e.Text = "q3" }),
		later.Ev(event.Finished, 5*time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "a3" }))
	flush(t, s)

	// What a restart would find: reopen the file from its path.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if res, err := store.IntegrityCheck(ctx, path); err != nil || res != "ok" {
		t.Errorf("integrity_check of the recreated file = %q, %v", res, err)
	}
	s2 := open(t, path, store.Options{})
	if h := msgs(mustHistory(t, s2, "s")); len(h) != 4 || h[0].Text != "q1" || h[3].Text != "a3" {
		t.Errorf("history of s in the recreated file = %+v, want q1 a1 q3 a3", h)
	}
	if got := mustTurn(t, s2, "running").State; got != store.TurnFinished {
		t.Errorf("turn ended after the deletion: state %s in the recreated file, want finished", got)
	}
	p, err := s2.Pending(ctx, "", 0)
	if err != nil || len(p) != 1 || p[0].RunID != "done" {
		t.Errorf("pending outbox in the recreated file = %+v, %v; want the undelivered reply", p, err)
	}
}

// TestRealFullDiskOnTmpfs is TestDiskFullKeepsEndingsAndRecovers on a real
// full file system: a 2 MiB tmpfs filled up by another file. It needs root
// (mount); elsewhere it is skipped and the max_page_count test stands.
func TestRealFullDiskOnTmpfs(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (needs root): %v: %s; TestDiskFullKeepsEndingsAndRecovers covers SQLITE_FULL", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		var hl healthLog
		s := open(t, filepath.Join(dir, "turnguard.db"), store.Options{OnHealth: hl.note})
		tr := newTurn("run-1", "s")
		s.Handle(tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "q" }))
		flush(t, s)

		// Fill the file system.
		filler := filepath.Join(dir, "filler")
		f, err := os.Create(filler)
		if err != nil {
			t.Fatal(err)
		}
		chunk := make([]byte, 4096)
		for {
			if _, err := f.Write(chunk); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("filling the tmpfs: %v", err)
				}
				break
			}
		}
		f.Close()

		reply := strings.Repeat("a long reply ", 20000)
		s.Handle(tr.Ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, reply }))
		synctest.Wait()
		if err := s.Health(); !errors.Is(err, store.ErrUnwritable) {
			t.Fatalf("Health on a full file system = %v, want ErrUnwritable", err)
		}
		faketime.Advance(30 * time.Second)
		synctest.Wait()
		if st := s.Stats(); st.Failed != 0 || st.QueueDepth != 0 {
			t.Errorf("stats while full = %+v: the ending must wait for a retry", st)
		}

		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		faketime.Advance(10 * time.Second)
		synctest.Wait()
		flush(t, s)
		if err := s.Health(); err != nil {
			t.Errorf("Health after space returned = %v", err)
		}
		if got := mustTurn(t, s, "run-1").State; got != store.TurnFinished {
			t.Errorf("turn after space returned = %s, want finished", got)
		}
		if got := hl.transitions(); len(got) != 2 {
			t.Errorf("OnHealth transitions = %v, want [unwritable recovered]", got)
		}
	})
}

// TestReplacedFileIsOpened: a database file replaced under the running
// store (a restore done without stopping the gateway) is opened, not
// overwritten; what comes next is written into it.
func TestReplacedFileIsOpened(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hl healthLog
		path := dbPath(t)
		s := open(t, path, store.Options{OnHealth: hl.note})
		old := newTurn("old", "s")
		s.Handle(old.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "before the restore" }))
		flush(t, s)

		// The "backup": another turnguard database with its own history.
		backup := filepath.Join(t.TempDir(), "backup.db")
		b := open(t, backup, store.Options{})
		restored := newTurn("restored", "s")
		b.Handle(restored.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "from the backup" }))
		flush(t, b)
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(backup, path+".new"); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}

		faketime.Advance(3 * time.Second)
		synctest.Wait()
		if err := s.Health(); err != nil {
			t.Fatalf("Health after the replacement = %v", err)
		}
		after := newTurn("after", "s")
		s.Handle(after.Ev(event.TurnStarted, time.Second, func(e *event.Event) { e.Text = "after the restore" }))
		flush(t, s)
		h := msgs(mustHistory(t, s, "s"))
		if len(h) != 2 || h[0].Text != "from the backup" || h[1].Text != "after the restore" {
			t.Errorf("history after the replacement = %+v, want the backup's message and the new one", h)
		}
		if got := hl.transitions(); len(got) != 2 {
			t.Errorf("OnHealth transitions = %v, want [unwritable recovered]", got)
		}
	})
}

// TestFileGoneStaysUnwritableUntilRecreated: while the file cannot be
// recreated (its directory is gone), the store stays unwritable even
// though writes into the open, deleted file succeed; events are still
// recorded (into the open copy) and survive in the file recreated once the
// directory is back.
func TestFileGoneStaysUnwritableUntilRecreated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hl healthLog
		dir := filepath.Join(t.TempDir(), "data")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "turnguard.db")
		s := open(t, path, store.Options{OnHealth: hl.note})
		tr := newTurn("run-1", "s")
		s.Handle(tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "q" }))
		flush(t, s)

		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		faketime.Advance(3 * time.Second)
		synctest.Wait()
		s.Handle(tr.Ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "a" }))
		flush(t, s)
		faketime.Advance(10 * time.Second)
		synctest.Wait()
		if err := s.Health(); !errors.Is(err, store.ErrUnwritable) || !strings.Contains(err.Error(), "deleted") {
			t.Fatalf("Health with the directory gone = %v, want unwritable: file deleted", err)
		}

		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		faketime.Advance(3 * time.Second)
		synctest.Wait()
		if err := s.Health(); err != nil {
			t.Fatalf("Health once the directory is back = %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s2 := open(t, path, store.Options{})
		if h := msgs(mustHistory(t, s2, "s")); len(h) != 2 || h[1].Text != "a" {
			t.Errorf("history in the recreated file = %+v, want the question and the reply", h)
		}
		if got := hl.transitions(); len(got) != 2 {
			t.Errorf("OnHealth transitions = %v, want [unwritable recovered]", got)
		}
	})
}

// TestDiskFullDuringPerEventRetryKeepsTheEnding: a batch that fails for one
// event's content is retried event by event; if the disk fills during those
// retries, the events not yet written (here a turn's ending) are kept and
// retried until space returns — not counted as bad and dropped while the
// store reports itself healthy.
func TestDiskFullDuringPerEventRetryKeepsTheEnding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan chan struct{}, 1)
		path := dbPath(t)
		s := open(t, path, store.WithBeforeBatch(store.Options{}, func() {
			select {
			case g := <-hold:
				<-g
			default:
			}
		}))
		ctx := context.Background()
		tr := newTurn("run-1", "s")
		s.Handle(tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "q" }))
		flush(t, s)
		// An event whose content the database refuses (a constraint).
		if err := store.ExecFile(ctx, path, `CREATE TRIGGER poison BEFORE INSERT ON messages
			WHEN NEW.text = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned message'); END`); err != nil {
			t.Fatal(err)
		}

		// Hold the writer on a first batch so the next two share one batch.
		g := make(chan struct{})
		hold <- g
		s.Handle(tr.Ev(event.Progress, time.Second, func(e *event.Event) { e.Step = step("tool", "slow", 1, 0) }))
		synctest.Wait()
		s.Handle(newTurn("run-2", "s").Ev(event.TurnStarted, time.Second, func(e *event.Event) { e.Text = "poison" }))
		reply := strings.Repeat("a long reply ", 20000) // ~260 KB: needs new pages
		s.Handle(tr.Ev(event.Finished, 2*time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, reply }))
		if _, err := store.LimitPages(s, 0); err != nil {
			t.Fatal(err)
		}
		close(g)
		synctest.Wait()

		if st := s.Stats(); st.Failed != 1 {
			t.Errorf("stats after the disk filled during the per-event retry = %+v, want only the poisoned event failed", st)
		}
		if err := s.Health(); !errors.Is(err, store.ErrUnwritable) {
			t.Errorf("Health with a full database = %v, want ErrUnwritable", err)
		}
		if got := mustTurn(t, s, "run-1").State; got != store.TurnRunning {
			t.Errorf("turn state while full = %s", got)
		}

		if _, err := store.LimitPages(s, 1<<30); err != nil {
			t.Fatal(err)
		}
		faketime.Advance(10 * time.Second)
		synctest.Wait()
		flush(t, s)
		if got := mustTurn(t, s, "run-1").State; got != store.TurnFinished {
			t.Errorf("turn after space returned = %s, want finished (its ending was dropped)", got)
		}
		if err := s.Health(); err != nil {
			t.Errorf("Health after space returned = %v", err)
		}
		if st := s.Stats(); st.Failed != 1 {
			t.Errorf("stats after recovery = %+v, want 1 failed", st)
		}
	})
}

// TestCloseHasOneDeadline: Close tries each queued batch once more, but with
// one deadline for all of them: with every write failing after a busy
// timeout (here a full disk, each attempt taking the 5 s busy timeout), 20
// queued batches took 100 s to give up; now Close returns within
// CloseDrainLimit plus the attempt under way, and counts the rest failed.
func TestCloseHasOneDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var slow atomic.Bool
		s := open(t, dbPath(t), store.WithBeforeBatch(store.Options{BatchSize: 1}, func() {
			if slow.Load() {
				faketime.Advance(5 * time.Second) // the busy timeout of a locked file
			}
		}))
		if _, err := store.LimitPages(s, 0); err != nil {
			t.Fatal(err)
		}
		big := strings.Repeat("a long question ", 20000) // needs new pages
		const n = 20
		for i := range n {
			s.Handle(newTurn(fmt.Sprintf("run-%d", i), "s").Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = big }))
		}
		synctest.Wait()
		slow.Store(true)
		start := time.Now()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > store.CloseDrainLimit+6*time.Second {
			t.Errorf("Close took %v with every write failing, want at most %v", d, store.CloseDrainLimit+6*time.Second)
		}
		if st := s.Stats(); st.Failed != n || st.QueueDepth != 0 {
			t.Errorf("stats after Close = %+v, want all %d events failed and nothing queued", st, n)
		}
	})
}
