package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Options tune a SQLite store. The zero value is valid.
type Options struct {
	// QueueSize is how many events may wait for the writer before Handle
	// starts shedding the events a turn can do without (see Handle). Turn
	// starts and endings are never shed: they wait beyond it. 0 means 4096
	// (config store.queueSize).
	QueueSize int
	// BatchSize is the most events written in one transaction. 0 means 256.
	BatchSize int
	// BusyTimeout is how long a statement waits for a lock held by another
	// process using the same file. 0 means 5s.
	BusyTimeout time.Duration
	// Logger receives write failures (run ids and errors, never message
	// text). nil means slog.Default().
	Logger *slog.Logger
	// Retention is what Prune removes and how often the store prunes on its
	// own. The zero value keeps everything and never prunes.
	Retention Retention
	// OnHealth, when set, is called on the writer goroutine each time the
	// store stops being able to write (err describes why, see Health) and
	// when it can write again (err nil). It must not block.
	OnHealth func(err error)
	// Unlocked skips the store's <path>.lock, which otherwise refuses a
	// second SQLite on the file (*InUseError). Only for something that
	// reads a store a gateway is using (a test watching it, a tool) or that
	// stands in for a second process: a gateway must never set it.
	Unlocked bool
	// OutboxChannels are the channels that deliver a turn's terminal
	// message out of band (e.g. "telegram"): for their turns, the writer
	// puts the ending's texts (messages.Ending: the reply, or the partial
	// reply and the notice) into the outbox in the same transaction that
	// records the turn's end, committed durably (synchronous=FULL), so the
	// turn is recorded as ended if and only if its message is in the
	// outbox. Channels served from the history (WebSocket) are not listed.
	OutboxChannels []string
	// OnOutbox, when set, is called on the writer goroutine after a batch
	// that put terminal messages into the outbox has committed, once per
	// channel concerned; the channel then claims its pending rows (Pending).
	// It must not block.
	OnOutbox func(channel string)

	// beforeBatch, when set (tests only, see export_test.go), is called by
	// the writer goroutine before it writes each batch.
	beforeBatch func()
	// beforeCommit and afterCommit, when set (tests only), are called by
	// the writer goroutine inside a batch's transaction just before its
	// commit and just after the commit (before OnOutbox): a test kills the
	// process there to simulate a crash.
	beforeCommit, afterCommit func()
}

const (
	defaultQueueSize   = 4096
	defaultBatchSize   = 256
	defaultBusyTimeout = 5 * time.Second
	readConns          = 4

	// checkInterval is how often the writer makes sure the database file
	// is still the one it opened (not deleted or replaced) and, while the
	// store cannot write, probes whether it can again.
	checkInterval = 2 * time.Second
	// firstRetry and maxRetry bound the backoff between attempts to write a
	// batch that failed for the state of the disk or the file.
	firstRetry = 100 * time.Millisecond
	maxRetry   = 5 * time.Second
)

// CloseDrainLimit bounds how long Close keeps writing what is queued: each
// queued batch gets one more attempt until then, and what is left after it
// is counted failed (logged) without an attempt. A batch under way finishes
// its attempt, so Close can take up to one busy timeout (5 s) longer.
const CloseDrainLimit = 10 * time.Second

// SQLite is the default Store: one SQLite file in WAL mode. All methods are
// safe for concurrent use.
//
// Writes go through a single connection (the event writer's batches and the
// synchronous outbox and MarkInterrupted calls take turns on it), so the
// process never contends with itself for SQLite's write lock; reads use a
// small pool of read-only connections and never wait for writes.
type SQLite struct {
	path   string
	memory bool
	log    *slog.Logger

	// dbMu guards the handles below: every method holds it for reading
	// while it uses them (acquire); the writer goroutine holds it for
	// writing while it reopens a database file that was deleted.
	dbMu sync.RWMutex
	w    *sql.DB     // one connection; every write
	r    *sql.DB     // read-only pool; == w for ":memory:"
	st   stmts       // prepared on w
	file os.FileInfo // the file opened, to notice it being deleted or replaced
	side sideFiles   // its -wal and -shm files, to remove only ours on a reopen

	// Event recording (recorder.go): the shared recorder, its queue,
	// writer goroutine, counters and write health; this file and
	// sqlite_events.go supply the SQL.
	*EventRecorder
	rec RecorderControl

	beforeCommit, afterCommit func() // tests: see Options.beforeCommit

	retention Retention
	busy      time.Duration // BusyTimeout, for a reopen

	lock *os.File // the held <path>.lock (lock.go); nil for ":memory:"

	closeOnce sync.Once
	closeErr  error
}

// Open opens (creating if needed) the SQLite database at path, migrates its
// schema to SchemaVersion and starts the event writer (and, with a
// retention policy, the pruner). path ":memory:" keeps everything in memory
// (one connection, lost on Close). The caller must call Close.
//
// Open refuses, with an error naming the file and without changing its
// data, a file that is not a SQLite database, a SQLite database of another
// application, and one whose schema is newer than this build
// (ErrSchemaTooNew).
//
// A file store is locked for the life of the SQLite: Open first takes an
// exclusive lock on <path>.lock and fails fast with *InUseError ("another
// gateway is using turnguard.db (pid …)") while another process holds it.
func Open(ctx context.Context, path string, opts Options) (*SQLite, error) {
	if path == "" {
		return nil, fmt.Errorf("open store: empty path: %w", ErrInvalid)
	}
	if opts.BusyTimeout <= 0 {
		opts.BusyTimeout = defaultBusyTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &SQLite{
		path: path, memory: path == ":memory:", log: opts.Logger,
		retention: opts.Retention.withDefaults(), beforeCommit: opts.beforeCommit, afterCommit: opts.afterCommit,
	}
	var err error
	s.EventRecorder, s.rec, err = NewEventRecorder(sqliteWriter{s}, opts.recorder())
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	if !s.memory && !opts.Unlocked {
		lock, err := lockFile(path)
		if err != nil {
			return nil, fmt.Errorf("open store %s: %w", path, err)
		}
		s.lock = lock
	}
	h, err := openDBs(ctx, path, s.memory, opts.BusyTimeout)
	if err != nil {
		if s.lock != nil {
			_ = unlockFile(s.lock)
		}
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	s.setHandles(h)
	s.busy = opts.BusyTimeout
	s.rec.Start()
	if s.retention.Enabled() {
		s.rec.StartPruner(s.retention.Interval, s.Prune)
	}
	return s, nil
}

// handles are one opening of the database file.
type handles struct {
	w, r *sql.DB
	st   stmts
	file os.FileInfo // nil for ":memory:"
	side sideFiles
}

func (s *SQLite) setHandles(h *handles) {
	s.w, s.r, s.st, s.file, s.side = h.w, h.r, h.st, h.file, h.side
}

func (h *handles) close() error {
	errs := []error{h.st.close()}
	if h.r != h.w {
		errs = append(errs, h.r.Close())
	}
	return errors.Join(append(errs, h.w.Close())...)
}

// openDBs opens path: the write connection, the schema, WAL, the read pool
// and the writer's statements.
func openDBs(ctx context.Context, path string, memory bool, busy time.Duration) (_ *handles, err error) {
	params := func(pragmas ...string) url.Values {
		q := url.Values{}
		q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", max(busy.Milliseconds(), 1)))
		q.Add("_pragma", "foreign_keys(1)")
		for _, p := range pragmas {
			q.Add("_pragma", p)
		}
		return q
	}
	wq := params()
	if !memory {
		wq = params("synchronous(NORMAL)")
	}
	// A write transaction takes the lock up front (BEGIN IMMEDIATE), so it
	// never fails to upgrade a read lock under another process's write.
	wq.Set("_txlock", "immediate")
	h := &handles{}
	h.w, err = sql.Open("sqlite", dsn(path, memory, wq))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			h.w.Close()
			if h.r != nil && h.r != h.w {
				h.r.Close()
			}
		}
	}()
	h.w.SetMaxOpenConns(1)
	h.w.SetMaxIdleConns(1)
	h.w.SetConnMaxLifetime(0)
	h.w.SetConnMaxIdleTime(0)
	if err := h.w.PingContext(ctx); err != nil {
		return nil, err
	}
	// WAL is a property of the file: switch it only once the file is known
	// to be ours.
	if _, err := checkVersion(ctx, h.w); err != nil {
		return nil, err
	}
	if !memory {
		var mode string
		if err := h.w.QueryRowContext(ctx, "PRAGMA journal_mode = WAL").Scan(&mode); err != nil {
			return nil, fmt.Errorf("enable WAL: %w", err)
		}
		if !strings.EqualFold(mode, "wal") {
			return nil, fmt.Errorf("enable WAL: journal mode is %q", mode)
		}
	}
	if _, err := migrate(ctx, h.w, SchemaVersion); err != nil {
		return nil, err
	}
	if memory {
		h.r = h.w
	} else {
		if h.file, err = os.Stat(path); err != nil {
			return nil, err
		}
		h.side.note(path)
		rq := params("query_only(1)")
		h.r, err = sql.Open("sqlite", dsn(path, false, rq))
		if err != nil {
			return nil, err
		}
		h.r.SetMaxOpenConns(readConns)
		h.r.SetMaxIdleConns(readConns)
		if err := h.r.PingContext(ctx); err != nil {
			return nil, err
		}
	}
	if err := h.st.prepare(ctx, h.w); err != nil {
		return nil, err
	}
	return h, nil
}

// dsn builds a modernc.org/sqlite data source name: a file: URI whose path
// is escaped so that '?', '#' and '%' in a file name are not taken for URI
// syntax.
func dsn(path string, memory bool, q url.Values) string {
	if memory {
		return "file::memory:?" + q.Encode()
	}
	esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	return "file:" + esc + "?" + q.Encode()
}

// Close writes every event enqueued before it, stops the writer (and the
// pruner) and closes the database. Events handed to Handle after Close are
// dropped and counted; one handed over while Close runs may be written or
// lost. Call it after the engine has stopped publishing. While the store
// cannot write, Close tries what is queued once more and counts what still
// fails as failed instead of waiting for the disk; it stops trying after
// CloseDrainLimit (plus the attempt under way) and counts the rest failed.
// Close is safe to call more than once; later calls return the first
// call's result.
func (s *SQLite) Close() error {
	s.closeOnce.Do(func() {
		s.rec.Stop()
		s.dbMu.Lock()
		defer s.dbMu.Unlock()
		if s.lock != nil {
			// Last: the database is closed before another process may open it.
			defer func() {
				if err := unlockFile(s.lock); err != nil && s.closeErr == nil {
					s.closeErr = fmt.Errorf("close store %s: %w", s.path, err)
				}
			}()
		}
		if s.w == nil {
			return // a reopen failed: nothing is open
		}
		h := handles{w: s.w, r: s.r, st: s.st}
		if err := h.close(); err != nil {
			s.closeErr = fmt.Errorf("close store %s: %w", s.path, err)
		}
	})
	return s.closeErr
}

// Path returns the database path given to Open.
func (s *SQLite) Path() string { return s.path }

// acquire returns ErrClosed once Close has been called; otherwise it holds
// the database handles (against a reopen) until release is called.
func (s *SQLite) acquire() (release func(), err error) {
	if s.rec.Closed() {
		return nil, ErrClosed
	}
	s.dbMu.RLock()
	if s.w == nil {
		s.dbMu.RUnlock()
		return nil, errNotOpen
	}
	return s.dbMu.RUnlock, nil
}

// durably runs fn in a write transaction committed with synchronous=FULL, so
// the commit survives a power loss and not only a process crash (the store
// otherwise runs with synchronous=NORMAL, which is enough for the journal).
func (s *SQLite) durably(ctx context.Context, fn func(*sql.Tx) error) (err error) {
	if s.w == nil {
		return errNotOpen
	}
	defer func() { s.rec.NoteWrite(err) }()
	conn, err := s.w.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if !s.memory {
		if _, err := conn.ExecContext(ctx, "PRAGMA synchronous = FULL"); err != nil {
			return err
		}
		defer func() {
			// A failure leaves the connection at FULL: slower, still correct.
			_, _ = conn.ExecContext(context.WithoutCancel(ctx), "PRAGMA synchronous = NORMAL")
		}()
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// inTx runs fn in a write transaction.
func (s *SQLite) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	if s.w == nil {
		return errNotOpen
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// errNotOpen: a reopen of a deleted or replaced file failed; the writer
// retries it.
var errNotOpen = fmt.Errorf("database file not open: %w", errFileGone)

// Times are stored as Unix nanoseconds; a zero time is NULL.

func nanos(t time.Time) int64 { return t.UnixNano() }

func nullNanos(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixNano()
}

// nullDuration stores a positive duration in nanoseconds; 0 (disabled) is NULL.
func nullDuration(d time.Duration) any {
	if d <= 0 {
		return nil
	}
	return int64(d)
}

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

func fromNullNanos(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return fromNanos(n.Int64)
}

// recorder is what o sets of the event recorder.
func (o Options) recorder() RecorderOptions {
	return RecorderOptions{QueueSize: o.QueueSize, BatchSize: o.BatchSize, Logger: o.Logger, OnHealth: o.OnHealth,
		OutboxChannels: o.OutboxChannels, OnOutbox: o.OnOutbox, BeforeBatch: o.beforeBatch}
}
