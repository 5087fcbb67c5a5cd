package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnguard/turnguard/gateway/event"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Options tune a SQLite store. The zero value is valid.
type Options struct {
	// QueueSize is how many events may wait for the writer; beyond it Handle
	// drops. 0 means 4096 (config store.queueSize).
	QueueSize int
	// BatchSize is the most events written in one transaction. 0 means 256.
	BatchSize int
	// BusyTimeout is how long a statement waits for a lock held by another
	// process using the same file. 0 means 5s.
	BusyTimeout time.Duration
	// Logger receives write failures (run ids and errors, never message
	// text). nil means slog.Default().
	Logger *slog.Logger

	// beforeBatch, when set (tests only, see export_test.go), is called by
	// the writer goroutine before it writes each batch.
	beforeBatch func()
}

const (
	defaultQueueSize   = 4096
	defaultBatchSize   = 256
	defaultBusyTimeout = 5 * time.Second
	readConns          = 4
)

// SQLite is the default Store: one SQLite file in WAL mode. All methods are
// safe for concurrent use.
//
// Writes go through a single connection (the event writer's batches and the
// synchronous outbox and MarkInterrupted calls take turns on it), so the
// process never contends with itself for SQLite's write lock; reads use a
// small pool of read-only connections and never wait for writes.
type SQLite struct {
	path   string
	w      *sql.DB // one connection; every write
	r      *sql.DB // read-only pool; == w for ":memory:"
	memory bool
	log    *slog.Logger
	st     stmts

	// Event recording (recorder.go).
	queue       chan event.Event
	batchSize   int
	beforeBatch func()
	enqueued    atomic.Uint64
	dropped     atomic.Uint64
	failed      atomic.Uint64
	written     atomic.Uint64
	closed      atomic.Bool
	stop        chan struct{} // closed by Close: drain the queue and exit
	done        chan struct{} // closed when the writer has exited

	mu        sync.Mutex
	processed uint64        // written + failed, guarded by mu
	progress  chan struct{} // closed and replaced after each batch, guarded by mu

	closeOnce sync.Once
	closeErr  error
}

// Open opens (creating if needed) the SQLite database at path, migrates its
// schema to SchemaVersion and starts the event writer. path ":memory:" keeps
// everything in memory (one connection, lost on Close). The caller must call
// Close.
//
// Open refuses, with an error naming the file and without changing its
// data, a file that is not a SQLite database, a SQLite database of another
// application, and one whose schema is newer than this build
// (ErrSchemaTooNew).
func Open(ctx context.Context, path string, opts Options) (*SQLite, error) {
	if path == "" {
		return nil, fmt.Errorf("open store: empty path: %w", ErrInvalid)
	}
	if opts.QueueSize <= 0 {
		opts.QueueSize = defaultQueueSize
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = defaultBatchSize
	}
	if opts.BusyTimeout <= 0 {
		opts.BusyTimeout = defaultBusyTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &SQLite{
		path: path, memory: path == ":memory:", log: opts.Logger,
		queue: make(chan event.Event, opts.QueueSize), batchSize: opts.BatchSize,
		beforeBatch: opts.beforeBatch,
		stop:        make(chan struct{}), done: make(chan struct{}), progress: make(chan struct{}),
	}
	if err := s.openDBs(ctx, opts.BusyTimeout); err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	go s.run()
	return s, nil
}

func (s *SQLite) openDBs(ctx context.Context, busy time.Duration) (err error) {
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
	if !s.memory {
		wq = params("synchronous(NORMAL)")
	}
	// A write transaction takes the lock up front (BEGIN IMMEDIATE), so it
	// never fails to upgrade a read lock under another process's write.
	wq.Set("_txlock", "immediate")
	s.w, err = sql.Open("sqlite", dsn(s.path, s.memory, wq))
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			s.w.Close()
			if s.r != nil && s.r != s.w {
				s.r.Close()
			}
		}
	}()
	s.w.SetMaxOpenConns(1)
	s.w.SetMaxIdleConns(1)
	s.w.SetConnMaxLifetime(0)
	s.w.SetConnMaxIdleTime(0)
	if err := s.w.PingContext(ctx); err != nil {
		return err
	}
	// WAL is a property of the file: switch it only once the file is known
	// to be ours.
	if _, err := checkVersion(ctx, s.w); err != nil {
		return err
	}
	if !s.memory {
		var mode string
		if err := s.w.QueryRowContext(ctx, "PRAGMA journal_mode = WAL").Scan(&mode); err != nil {
			return fmt.Errorf("enable WAL: %w", err)
		}
		if !strings.EqualFold(mode, "wal") {
			return fmt.Errorf("enable WAL: journal mode is %q", mode)
		}
	}
	if _, err := migrate(ctx, s.w, SchemaVersion); err != nil {
		return err
	}
	if s.memory {
		s.r = s.w
	} else {
		rq := params("query_only(1)")
		s.r, err = sql.Open("sqlite", dsn(s.path, false, rq))
		if err != nil {
			return err
		}
		s.r.SetMaxOpenConns(readConns)
		s.r.SetMaxIdleConns(readConns)
		if err := s.r.PingContext(ctx); err != nil {
			return err
		}
	}
	return s.st.prepare(ctx, s.w)
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

// Close writes every event enqueued before it, stops the writer and closes
// the database. Events handed to Handle after Close are dropped and counted;
// one handed over while Close runs may be written or lost. Call it after the
// engine has stopped publishing.
// Close is safe to call more than once; later calls return the first
// call's result.
func (s *SQLite) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.stop)
		<-s.done
		errs := []error{s.st.close()}
		if s.r != s.w {
			errs = append(errs, s.r.Close())
		}
		errs = append(errs, s.w.Close())
		if err := errors.Join(errs...); err != nil {
			s.closeErr = fmt.Errorf("close store %s: %w", s.path, err)
		}
	})
	return s.closeErr
}

// Path returns the database path given to Open.
func (s *SQLite) Path() string { return s.path }

// checkOpen returns ErrClosed once Close has been called.
func (s *SQLite) checkOpen() error {
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}

// durably runs fn in a write transaction committed with synchronous=FULL, so
// the commit survives a power loss and not only a process crash (the store
// otherwise runs with synchronous=NORMAL, which is enough for the journal).
func (s *SQLite) durably(ctx context.Context, fn func(*sql.Tx) error) error {
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
