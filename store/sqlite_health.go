package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// errFileGone is the cause while the database file is missing or replaced.
var errFileGone = errors.New("the database file was deleted or replaced under the running gateway")

// classify says what err is: SQLite's report of a statement's
// content (a constraint, a type mismatch, a value too big), or of a disk or
// file that cannot take writes.
func (s *SQLite) classify(err error) Failure {
	f := Failure{Reason: "writes to the database fail"}
	if errors.Is(err, errFileGone) {
		f.Reason = errFileGone.Error()
		return f
	}
	se, ok := errors.AsType[*sqlite.Error](err)
	if !ok {
		return f
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_RANGE:
		f.EventSpecific = true
	case sqlite3.SQLITE_FULL:
		f.Storage, f.Reason = true, "the disk (or the database's size limit) is full"
	case sqlite3.SQLITE_IOERR:
		f.Storage, f.Reason = true, "the disk reports I/O errors"
	case sqlite3.SQLITE_READONLY:
		f.Storage, f.Reason = true, "the database file is read-only"
	case sqlite3.SQLITE_CANTOPEN:
		f.Storage, f.Reason = true, "the database file cannot be opened"
	case sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB:
		f.Storage, f.Reason = true, "the database file is corrupt"
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_PROTOCOL:
		f.Storage, f.Reason = true, "the database is locked by another process"
	}
	return f
}

// probeBytes is what a probe writes (and deletes again in the same
// transaction): enough to need new pages, so a full disk or size limit
// fails it.
const probeBytes = 16 << 10

// probe tries a small real write.
func (s *SQLite) probe(ctx context.Context) error {
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
	if s.memory || s.rec.Closed() {
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
	s.rec.Hold(errFileGone)
	if err := s.reopen(gone); err != nil {
		s.log.Error("store: cannot recreate the database file; retrying", "path", s.path, "err", err)
		return false
	}
	s.log.Warn("store: the database file was deleted or replaced under the running gateway and has been reopened",
		"path", s.path, "recreated_from_open_copy", gone)
	s.rec.Release()
	s.rec.SetHealth(s.probe(context.Background()))
	return true
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
