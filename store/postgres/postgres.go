// Package postgres owns turnguard's store on PostgreSQL: the same sessions,
// chat history, turns, journal, outbox, queued messages and approvals as
// the SQLite store, with the same semantics (the conformance suite
// store/storetest runs against both), in a database that several gateway
// replicas can share. It owns its schema (migrations/*.sql, applied on Open in one
// transaction under an advisory lock, so replicas that start together
// migrate once) and the SQL of every read and write; the asynchronous
// event recorder — its queue, writer goroutine, Flush, counters and write
// health — is store.EventRecorder, shared with SQLite.
//
// Durability: a commit is acknowledged by the server once it is in its
// write-ahead log as the database's synchronous_commit says. The writes
// that must survive a server crash — a turn's end with its outbox rows,
// Enqueue, the queued messages, MarkInterrupted — set synchronous_commit on
// for their own transaction, whatever the database's default; the other
// event batches (steps, the journal) follow the default, so an operator may
// set it off to trade the last fraction of a second of journal on a server
// crash for write latency (see docs/operations.md).
//
// The connection URL carries a password: it never appears in an error or a
// log line of this package (Redact).
package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/turnguard/turnguard/store"
)

// Options tune a PostgreSQL store. The zero value is valid.
type Options struct {
	// QueueSize, BatchSize, Logger, Retention, OnHealth, OutboxChannels
	// and OnOutbox are as in store.Options.
	QueueSize      int
	BatchSize      int
	Logger         *slog.Logger
	Retention      store.Retention
	OnHealth       func(err error)
	OutboxChannels []string
	OnOutbox       func(channel string)
	// MaxConns bounds the connection pool; 0 means 8. The event writer
	// holds one connection while it writes a batch.
	MaxConns int32
	// Shared says that several gateways use the database together (the
	// cluster's replicas, which coordinate through it). When false — one
	// gateway, the default — Open takes an advisory lock that the store
	// holds on a connection of its own until Close, and refuses a database
	// another gateway holds (*InUseError), as the SQLite store refuses a
	// file another process has locked.
	Shared bool

	beforeBatch func() // tests: see export_test.go
	// beforeCommit and afterCommit, when set (tests only), are called by
	// the writer goroutine inside a batch's transaction just before its
	// commit and just after the commit: a test kills the process there.
	beforeCommit, afterCommit func()
	// commitCheck, when set (tests only), is called by the writer
	// goroutine inside each batch's transaction just before its commit
	// with the transaction's synchronous_commit.
	commitCheck func(synchronousCommit string)
}

const (
	defaultMaxConns = 8
	// statementTimeout bounds every statement on the server, so a stuck
	// lock or server cannot hold the writer forever.
	statementTimeout = 30 * time.Second
)

// Store is the PostgreSQL store. All methods are safe for concurrent use.
type Store struct {
	pool      *pgxpool.Pool
	log       *slog.Logger
	retention store.Retention
	where     string // the redacted URL, for errors and logs

	beforeCommit, afterCommit func()                         // tests: see Options.beforeCommit
	commitCheck               func(synchronousCommit string) // tests: see Options.commitCheck

	// owner holds ownerLock (Options.Shared false); only the writer
	// goroutine (Check) replaces it, and Close closes it.
	ownerMu   sync.Mutex
	owner     *pgx.Conn
	ownerLost bool // another gateway took ownerLock: the store is held unwritable
	shared    bool
	claimed   claimedRuns // the writer goroutine's: runs it saw claimed, not yet ended
	claims    *Claims     // shared mode: the turns this process claimed, until their TurnStarted
	carried   []stepRun   // the writer goroutine's: step changes its last batch skipped (stepRows.skipped)

	*store.EventRecorder
	rec store.RecorderControl

	closeOnce sync.Once
}

var _ store.Backend = (*Store)(nil)

// sharedLinger is the recorder's store.RecorderOptions.Linger: in shared
// mode its batches mostly shadow claimed turns (commitMode), and waiting
// 10 ms for fuller batches saves statements and commits (issue 21); with
// one gateway the recorder writes the turns' only record, at once.
func sharedLinger(shared bool) time.Duration {
	if shared {
		return 10 * time.Millisecond
	}
	return 0
}

// Open connects to the database at rawURL (postgres://user:password@host:
// port/database?…), migrates its schema and starts the event writer (and,
// with a retention policy, the pruner). The caller must call Close.
//
// Open refuses, without changing it, a database whose schema is newer than
// this build (store.ErrSchemaTooNew) and one with tables but no turnguard
// schema version (another application's). Its errors name the database
// with the password redacted.
func Open(ctx context.Context, rawURL string, opts Options) (_ *Store, err error) {
	where := Redact(rawURL)
	defer func() {
		if err != nil {
			err = &openError{where: where, err: err, secret: password(rawURL)}
		}
	}()
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, fmt.Errorf("parse the URL: %w", err)
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = defaultMaxConns
	}
	cfg.MaxConns = opts.MaxConns
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "turnguard"
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = fmt.Sprint(statementTimeout.Milliseconds())
	cfg.ConnConfig.RuntimeParams["timezone"] = "UTC"
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Store{log: opts.Logger, retention: opts.Retention, where: where, shared: opts.Shared,
		beforeCommit: opts.beforeCommit, afterCommit: opts.afterCommit, commitCheck: opts.commitCheck}
	if s.shared {
		s.claims = &Claims{}
	}
	s.EventRecorder, s.rec, err = store.NewEventRecorder(writer{s}, store.RecorderOptions{
		QueueSize: opts.QueueSize, BatchSize: opts.BatchSize, Logger: opts.Logger, OnHealth: opts.OnHealth,
		OutboxChannels: opts.OutboxChannels, OnOutbox: opts.OnOutbox, BeforeBatch: opts.beforeBatch,
		Linger: sharedLinger(opts.Shared),
	})
	if err != nil {
		return nil, err
	}
	s.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := s.pool.Ping(ctx); err != nil {
		s.pool.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	if !s.shared {
		if s.owner, err = lockOwner(ctx, s.pool, where); err != nil {
			s.pool.Close()
			return nil, err
		}
	}
	if err := migrate(ctx, s.pool); err != nil {
		s.closeOwner()
		s.pool.Close()
		return nil, err
	}
	s.rec.Start()
	if opts.Retention.Enabled() {
		s.rec.StartPruner(opts.Retention.Interval, s.Prune)
	}
	return s, nil
}

// Close writes every event enqueued before it (within
// store.CloseDrainLimit), stops the writer and the pruner and closes the
// connections; see store.SQLite.Close. It is safe to call more than once.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.rec.Stop()
		s.closeOwner()
		s.pool.Close()
	})
	return nil
}

// Where is the database's URL with its password redacted.
func (s *Store) Where() string { return s.where }

// live returns store.ErrClosed once Close has been called.
func (s *Store) live() error {
	if s.rec.Closed() {
		return store.ErrClosed
	}
	return nil
}

// inTx runs fn in a transaction; durable sets synchronous_commit on for it.
// A failure for the state of the server makes the store unwritable until a
// write succeeds again (Health).
func (s *Store) inTx(ctx context.Context, durable bool, fn func(pgx.Tx) error) error {
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if durable {
			if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
				return err
			}
		}
		return fn(tx)
	})
	s.rec.NoteWrite(err)
	return err
}

// Redact is rawURL without its password (and without query parameters,
// which may carry one): for errors and logs. A URL that does not parse is
// redacted whole.
func Redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return "postgres://[redacted]"
	}
	var b strings.Builder
	b.WriteString(u.Scheme + "://")
	if u.User != nil {
		b.WriteString(u.User.Username())
		if _, ok := u.User.Password(); ok {
			b.WriteString(":[redacted]")
		}
		b.WriteString("@")
	}
	b.WriteString(u.Host + u.EscapedPath())
	if u.RawQuery != "" {
		b.WriteString("?[redacted]")
	}
	return b.String()
}

// password is the URL's password, "" if none.
func password(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.User == nil {
		return ""
	}
	p, _ := u.User.Password()
	return p
}

// openError is an error of Open: its text names the database by its
// redacted URL and has the password scrubbed out of whatever the driver
// said.
type openError struct {
	where  string
	err    error
	secret string
}

func (e *openError) Error() string {
	msg := fmt.Sprintf("open store %s: %v", e.where, e.err)
	if e.secret != "" {
		msg = strings.ReplaceAll(msg, e.secret, "[redacted]")
	}
	return msg
}

func (e *openError) Unwrap() error { return e.err }

// errNotOurs: the database has tables but no turnguard schema version.
var errNotOurs = errors.New("not a turnguard database: it has tables but no turnguard schema version")
