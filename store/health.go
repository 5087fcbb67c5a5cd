package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// ErrUnwritable: the store cannot write now. Health returns an
// *UnwritableError that wraps it.
var ErrUnwritable = errors.New("store cannot write")

// errFileGone is the cause while the database file is missing or replaced.
var errFileGone = errors.New("the database file was deleted or replaced under the running gateway")

// UnwritableError says why and since when the store cannot write.
type UnwritableError struct {
	Reason string    // for people: "the disk is full", …
	Since  time.Time // the first failure of the episode
	Err    error     // the failure (for logs)
}

func (e *UnwritableError) Error() string {
	return fmt.Sprintf("store cannot write since %s: %s", e.Since.UTC().Format(time.RFC3339), e.Reason)
}

// Unwrap makes errors.Is(err, ErrUnwritable) and the underlying error
// reachable.
func (e *UnwritableError) Unwrap() []error { return []error{ErrUnwritable, e.Err} }

// Health returns nil while the store can write, and an *UnwritableError
// (wrapping ErrUnwritable) from a write that failed for the state of the
// disk or the file — full, I/O error, read-only, locked by another process,
// corrupt, or the file deleted — until a write (a queued batch or the
// writer's probe, every few seconds) succeeds again. It never does I/O.
func (s *SQLite) Health() error {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	if s.unwrit == nil {
		return nil
	}
	cp := *s.unwrit
	return &cp
}

// setHealth records the outcome of a write by the writer: nil ends an
// unwritable episode, an error starts one (or continues it).
func (s *SQLite) setHealth(err error) {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	prev := s.unwrit
	if err == nil {
		if prev == nil || s.fileMissing {
			return // writes to a deleted file succeed: only a reopen ends that
		}
		s.unwrit = nil
		s.log.Warn("store: writing again; new turns are accepted", "unwritable_for", time.Since(prev.Since).Round(time.Millisecond).String())
		if s.onHealth != nil {
			s.onHealth(nil)
		}
		return
	}
	if prev != nil {
		if s.fileMissing {
			return
		}
		prev.Err = err
		if r := reasonOf(err); r != prev.Reason {
			prev.Reason = r
		}
		return
	}
	s.unwrit = &UnwritableError{Reason: reasonOf(err), Since: time.Now(), Err: err}
	s.log.Error("store: cannot write; readiness fails and new turns are refused until it can",
		"reason", s.unwrit.Reason, "err", err)
	if s.onHealth != nil {
		cp := *s.unwrit
		s.onHealth(&cp)
	}
}

// noteWrite is called with the outcome of a synchronous write (outbox,
// MarkInterrupted): a failure for the state of the disk starts an
// unwritable episode and has the writer probe until it ends.
func (s *SQLite) noteWrite(err error) {
	if err == nil || !storageFailure(err) {
		return
	}
	s.setHealth(err)
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// storageFailure reports whether err is SQLite's report of a disk or file
// that cannot take writes.
func storageFailure(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN,
		sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_PROTOCOL:
		return true
	}
	return false
}

// reasonOf is the short, human cause of a write failure.
func reasonOf(err error) string {
	if errors.Is(err, errFileGone) {
		return errFileGone.Error()
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_FULL:
			return "the disk (or the database's size limit) is full"
		case sqlite3.SQLITE_IOERR:
			return "the disk reports I/O errors"
		case sqlite3.SQLITE_READONLY:
			return "the database file is read-only"
		case sqlite3.SQLITE_CANTOPEN:
			return "the database file cannot be opened"
		case sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB:
			return "the database file is corrupt"
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_PROTOCOL:
			return "the database is locked by another process"
		}
	}
	return "writes to the database fail"
}

// maintain runs on the writer goroutine between batches: it makes sure the
// file is still the one open and, while the store cannot write, probes.
func (s *SQLite) maintain() {
	if !s.checkFile() {
		return
	}
	if s.Health() != nil {
		s.setHealth(s.probe())
	}
}

// probeBytes is what a probe writes (and deletes again in the same
// transaction): enough to need new pages, so a full disk or size limit
// fails it.
const probeBytes = 16 << 10

// probe tries a small real write.
func (s *SQLite) probe() error {
	if s.closed.Load() {
		return nil
	}
	ctx := context.Background()
	return s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO journal (run_id, session_key, kind, message, at)
			VALUES ('', '', 'probe', hex(zeroblob(?)), 0)`, probeBytes/2)
		if err != nil {
			return err
		}
		id, err := res.LastInsertId()
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM journal WHERE id = ?`, id)
		return err
	})
}

// checkFile notices that the database file was deleted (or replaced) under
// the process: SQLite keeps writing to the open, unlinked file, so nothing
// fails, but everything written would be lost at exit. A deleted file is
// recreated from the open copy (VACUUM INTO, then renamed into place), so
// history, running turns and undelivered outbox rows survive; a replaced
// file is opened (and migrated) instead. Either way the old file's -wal and
// -shm are removed first (see sideFiles). Until that succeeds the store is
// unwritable (an alert, readiness fails) and it is retried at each check.
//
// It reports whether the file is (again) the one open.
func (s *SQLite) checkFile() bool {
	if s.memory || s.closed.Load() {
		return true
	}
	fi, err := os.Stat(s.path)
	gone := errors.Is(err, os.ErrNotExist)
	switch {
	case err != nil && !gone:
		return true // cannot tell (permissions); the writes will say
	case err == nil && s.file != nil && os.SameFile(fi, s.file):
		s.side.note(s.path) // the -wal and -shm files exist once used
		return true
	}
	s.setFileMissing(true)
	s.setHealth(errFileGone)
	if err := s.reopen(gone); err != nil {
		s.log.Error("store: cannot recreate the database file; retrying", "path", s.path, "err", err)
		return false
	}
	s.log.Warn("store: the database file was deleted or replaced under the running gateway and has been reopened",
		"path", s.path, "recreated_from_open_copy", gone)
	s.setFileMissing(false)
	s.setHealth(s.probe())
	return true
}

// setFileMissing marks the database file as gone (the store is unwritable
// whatever writes to the old file do) until a reopen succeeds.
func (s *SQLite) setFileMissing(v bool) {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	s.fileMissing = v
}

// reopen swaps the database handles for ones on a fresh opening of path,
// first recreating the file from the open copy when it is gone.
func (s *SQLite) reopen(gone bool) error {
	ctx := context.Background()
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if gone && s.w != nil {
		tmp := s.path + ".recover"
		_ = os.Remove(tmp)
		if _, err := s.w.ExecContext(ctx, `VACUUM INTO ?`, tmp); err != nil {
			_ = os.Remove(tmp)
			return fmt.Errorf("copy the open database: %w", err)
		}
		side := s.side
		s.closeHandles()
		side.removeOurs(s.path)
		if err := os.Rename(tmp, s.path); err != nil {
			return fmt.Errorf("put the copy in place: %w", err)
		}
	} else {
		side := s.side
		s.closeHandles()
		side.removeOurs(s.path)
	}
	h, err := openDBs(ctx, s.path, false, s.busy)
	if err != nil {
		return err
	}
	s.setHandles(h)
	return nil
}

// closeHandles closes the current handles (dbMu held for writing).
func (s *SQLite) closeHandles() {
	if s.w == nil {
		return
	}
	h := handles{w: s.w, r: s.r, st: s.st}
	if err := h.close(); err != nil {
		s.log.Warn("store: closing the old database handles", "err", err)
	}
	s.w, s.r, s.st, s.file, s.side = nil, nil, stmts{}, nil, sideFiles{}
}

// sideFiles are the -wal and -shm files of the open database. SQLite does
// not checkpoint or delete the WAL of a database file that was deleted or
// renamed while open; left in place, it would be replayed into whatever
// file is at the path next (old pages over new data). A reopen removes
// them, but only if they are still ours: a restore may have put its own
// -wal next to the restored file.
type sideFiles struct{ wal, shm os.FileInfo }

// note records the side files if not yet known.
func (f *sideFiles) note(path string) {
	if f.wal == nil {
		f.wal, _ = os.Stat(path + "-wal")
	}
	if f.shm == nil {
		f.shm, _ = os.Stat(path + "-shm")
	}
}

// removeOurs removes the side files at path that are the ones noted.
func (f sideFiles) removeOurs(path string) {
	for _, p := range []struct {
		name string
		fi   os.FileInfo
	}{{path + "-wal", f.wal}, {path + "-shm", f.shm}} {
		if cur, err := os.Stat(p.name); err == nil && p.fi != nil && os.SameFile(cur, p.fi) {
			_ = os.Remove(p.name)
		}
	}
}
