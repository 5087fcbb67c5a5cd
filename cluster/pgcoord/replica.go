package pgcoord

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/postgres"
)

// Errors callers branch on; they are returned wrapped (errors.Is).
var (
	// ErrFenced: this replica may no longer own turns (its lease was not
	// renewed in time, or is lost). Stop its runs, publish nothing more of
	// them, and Join again to run turns.
	ErrFenced = errors.New("replica fenced")
	// ErrLeaseLost: the replica's lease row is gone, expired or superseded
	// by a newer epoch of the same replica id. It fences the replica for
	// good; errors wrapping it also wrap ErrFenced.
	ErrLeaseLost = errors.New("lease lost: its row is gone, expired or superseded")
	// ErrStale: Finish was refused — the turn is no longer running under
	// this replica's epoch (a survivor took it over, or it ended), or this
	// replica is fenced. Nothing was written; publish nothing.
	ErrStale = errors.New("not the turn's owner any more")
)

// MinLease is the shortest lease Join accepts.
const MinLease = 100 * time.Millisecond

// Options configure a replica. ReplicaID, Lease and Notice are required.
type Options struct {
	// ReplicaID names this gateway in the cluster (its host name, say): the
	// same id after a restart is the same replica with a new epoch, and
	// supersedes its earlier epochs at once.
	ReplicaID string
	// Lease is how long the database keeps this replica's lease without a
	// renewal (leaseSeconds). The replica renews it every Lease/3 and
	// fences itself at 2/3 of it without a successful renewal.
	Lease time.Duration
	// OutboxChannels are the channels that deliver out of band, as in
	// store/postgres Options.OutboxChannels: Finish and a takeover write a
	// turn's terminal messages to the outbox when its channel is one of
	// them and it has a chat reference.
	OutboxChannels []string
	// OnOutbox, when set, is called after a Finish or a takeover committed
	// outbox rows for channel (as store/postgres Options.OnOutbox).
	OnOutbox func(channel string)
	// Notice renders the interrupted notice of a turn taken over from a
	// dead replica (the gateway renders an Aborted event with stop reason
	// interrupted with messages.Render, as its crash recovery does). The
	// Turn carries the run's session, channel, steps and limits;
	// UpdatedAt is when its replica was last known alive (its last lease
	// renewal, on the database's clock), so UpdatedAt - StartedAt is how
	// long it ran. It is called inside the takeover's transaction: it must
	// be quick and must not call the database.
	Notice func(t store.Turn) string
	// Resume, when set, decides whether a turn taken over is dispatched
	// again (agents.defaults.resume; the gateway's start-up recovery
	// decides the same way): given the turn (Sender included), the record
	// of its own attempt (found false: its first) and the person's text
	// ("" when not kept), it returns the next attempt's record and queued
	// message, and the notice that ends the turn instead of Notice's, with
	// true. The takeover writes them in its transaction
	// (postgres.QueueResumeTx), so the turn's ending and its next attempt
	// commit together; the caller restores the sessions' queued messages
	// after OnTakeover. Called inside that transaction: quick, no database.
	Resume func(t store.Turn, prev store.Resume, found bool, text string) (store.Resume, store.QueuedMessage, string, bool)
	// OnFenced, when set, is called once, on a goroutine of its own, when
	// the replica is fenced, with the reason (wrapping ErrFenced).
	OnFenced func(err error)
	// OnTakeover, when set, makes the replica survey by itself: every
	// SurveyEvery, and right when the next foreign lease is due to expire.
	// It is called, on the survey goroutine, with each takeover this
	// replica made. Leave it nil to call Survey yourself.
	OnTakeover func(Takeover)
	// OnLeave, when set, is called by Leave with the turns it ended as
	// interrupted (those still claimed under this epoch), after their
	// commit and before Leave returns, so the caller can tell their
	// watchers; not called when there were none.
	OnLeave func(Takeover)
	// SurveyEvery bounds the wait between two surveys of the replica's own
	// loop; 0 means Lease/3.
	SurveyEvery time.Duration
	// Logger receives fences and takeovers; nil means slog.Default().
	Logger *slog.Logger
	// MaxConns bounds the pool JoinURL opens; 0 means 8.
	MaxConns int32
	// Claims, when set, is told of every claim this replica committed, with
	// the limits it wrote: pass the Claims of this process's store
	// (postgres.Store.Claims), whose recorder then writes nothing for those
	// turns' starts (issue 21).
	Claims *Claims
}

// Replica is one gateway's membership in the cluster: its lease (one epoch)
// and what it may do under it. All methods are safe for concurrent use.
type Replica struct {
	pool    *pgxpool.Pool
	ownPool bool
	id      string
	epoch   int64
	lease   time.Duration
	opts    Options
	outbox  map[string]bool
	log     *slog.Logger
	group   committer // claims' and finishes' group commit

	fenced    chan struct{}
	fenceOnce sync.Once
	fenceMu   sync.Mutex
	fenceErr  error

	stop    context.CancelFunc
	bg      sync.WaitGroup
	endOnce sync.Once
}

// JoinURL is Join on a pool of its own connected to rawURL (postgres://…);
// Leave closes it. A pool of its own keeps lease renewals from waiting
// behind the store's writes. Errors never show the URL's password.
func JoinURL(ctx context.Context, rawURL string, opts Options) (*Replica, error) {
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, fmt.Errorf("join the cluster at %s: parse the URL: %w", postgres.Redact(rawURL), scrub(err, rawURL))
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = 8
	}
	cfg.MaxConns = opts.MaxConns
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "turnguard-coord"
	cfg.ConnConfig.RuntimeParams["timezone"] = "UTC"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("join the cluster at %s: %w", postgres.Redact(rawURL), scrub(err, rawURL))
	}
	r, err := Join(ctx, pool, opts)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("%w (database %s)", scrub(err, rawURL), postgres.Redact(rawURL))
	}
	r.ownPool = true
	return r, nil
}

// Join makes this gateway a replica of the cluster whose database pool
// reaches: it migrates the schema if needed (store/postgres.Migrate),
// supersedes the earlier epochs of opts.ReplicaID (their leases expire at
// once: a survivor takes their turns over), inserts a lease with a new
// epoch and starts renewing it. The caller must call Leave. pool stays the
// caller's; it must have a connection free for a renewal within 2/3 of the
// lease (JoinURL gives the replica a pool of its own).
func Join(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Replica, error) {
	switch {
	case opts.ReplicaID == "":
		return nil, fmt.Errorf("join the cluster: no replica id: %w", store.ErrInvalid)
	case opts.Lease < MinLease:
		return nil, fmt.Errorf("join the cluster: lease %s is shorter than %s: %w", opts.Lease, MinLease, store.ErrInvalid)
	case opts.Notice == nil:
		return nil, fmt.Errorf("join the cluster: no Notice to render interrupted notices with: %w", store.ErrInvalid)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.SurveyEvery <= 0 {
		opts.SurveyEvery = opts.Lease / 3
	}
	if err := postgres.Migrate(ctx, pool); err != nil {
		return nil, fmt.Errorf("join the cluster as %q: %w", opts.ReplicaID, err)
	}
	r := &Replica{pool: pool, id: opts.ReplicaID, lease: opts.Lease, opts: opts, outbox: map[string]bool{},
		log: opts.Logger.With("replica", opts.ReplicaID), fenced: make(chan struct{}), group: committer{pool: pool, pace: groupPace}}
	for _, c := range opts.OutboxChannels {
		r.outbox[c] = true
	}
	sent := time.Now() // a lower bound of the server's now() below
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE leases SET expires_at = least(expires_at, now()) WHERE replica_id = $1`, r.id); err != nil {
			return fmt.Errorf("supersede earlier epochs: %w", err)
		}
		return tx.QueryRow(ctx, `INSERT INTO leases (replica_id, joined_at, renewed_at, expires_at)
			VALUES ($1, now(), now(), now() + $2::bigint * interval '1 microsecond') RETURNING epoch`,
			r.id, r.lease.Microseconds()).Scan(&r.epoch)
	})
	if err != nil {
		return nil, fmt.Errorf("join the cluster as %q: %w", r.id, err)
	}
	r.log = r.log.With("epoch", r.epoch)
	bg, stop := context.WithCancel(context.Background())
	r.stop = stop
	r.bg.Go(func() {
		d := &dbRenewer{r: r}
		err := keepAlive(bg, d, fencingFor(r.lease), sent)
		d.close()
		if err != nil {
			r.fence(err)
		}
	})
	if opts.OnTakeover != nil {
		r.bg.Go(func() { r.surveyLoop(bg) })
	}
	return r, nil
}

// ID is the replica's id; Epoch its lease's epoch (new at every Join).
func (r *Replica) ID() string   { return r.id }
func (r *Replica) Epoch() int64 { return r.epoch }

// Owner is how this replica epoch is named in the database's claims
// (outbox claimed_by): "id#epoch".
func (r *Replica) Owner() string { return ownerOf(r.id, r.epoch) }

// ownerOf is the claimed_by of replica id's epoch.
func ownerOf(id string, epoch int64) string { return id + "#" + strconv.FormatInt(epoch, 10) }

// Fenced is closed once the replica is fenced; Err then says why.
func (r *Replica) Fenced() <-chan struct{} { return r.fenced }

// Err is nil while the replica holds its lease, then the reason it was
// fenced (wrapping ErrFenced, and ErrLeaseLost when the database said so).
func (r *Replica) Err() error {
	r.fenceMu.Lock()
	defer r.fenceMu.Unlock()
	return r.fenceErr
}

// fence records the first reason, closes Fenced, tells OnFenced and tries
// once to expire the lease at once, so survivors need not wait for it.
func (r *Replica) fence(err error) {
	if !errors.Is(err, ErrFenced) {
		err = fmt.Errorf("%w: %w", ErrFenced, err)
	}
	if !r.end(err) {
		return
	}
	r.log.Error("cluster: replica fenced: its runs must stop and publish nothing", "error", err)
	if r.opts.OnFenced != nil {
		go r.opts.OnFenced(err)
	}
	// On a goroutine of its own: fence may be called inside a claim's
	// transaction, which must not wait for another connection.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), r.lease/3)
		defer cancel()
		_, _ = r.pool.Exec(ctx, `UPDATE leases SET expires_at = least(expires_at, now()) WHERE epoch = $1`, r.epoch)
	}()
}

// end makes every later call fail with err; false if it had already ended.
func (r *Replica) end(err error) bool {
	first := false
	r.fenceOnce.Do(func() {
		r.fenceMu.Lock()
		r.fenceErr = err
		r.fenceMu.Unlock()
		close(r.fenced)
		first = true
	})
	return first
}

// live is nil unless the replica is fenced.
func (r *Replica) live() error {
	select {
	case <-r.fenced:
		return r.Err()
	default:
		return nil
	}
}

// Leave ends the membership: it stops renewing and surveying, ends as
// interrupted (with their notices, as a takeover would; then OnLeave) the
// turns still claimed under this epoch — call it after the engine has
// finished its turns — and deletes the lease; then it closes the pool
// JoinURL opened.
// A fenced replica only stops (its lease is a survivor's to take over).
// It is safe to call more than once; later calls return nil.
func (r *Replica) Leave(ctx context.Context) error {
	var err error
	r.endOnce.Do(func() {
		r.stop()
		r.bg.Wait()
		if r.end(fmt.Errorf("%w: left the cluster", ErrFenced)) {
			var t Takeover
			if t, _, err = r.takeOver(ctx, lease{epoch: r.epoch, replica: r.id}, 0); err != nil {
				err = fmt.Errorf("leave the cluster: %w", err)
			} else if len(t.Turns) > 0 && r.opts.OnLeave != nil {
				r.opts.OnLeave(t)
			}
		}
		if r.ownPool {
			r.pool.Close()
		}
	})
	return err
}

// Abandon ends the membership as a crash would: it stops renewing and
// surveying and writes nothing, so the lease runs out on the database's
// clock and a survivor takes the epoch's turns over (their notices are the
// survivor's to publish). Every later call fails as for a fenced replica
// (OnFenced is not called: the caller knows). It is for a process that must
// stop at once, and for tests of a replica's death. Leave after it only
// closes the pool; it is safe to call more than once.
func (r *Replica) Abandon() {
	r.stop()
	r.bg.Wait()
	r.end(fmt.Errorf("%w: abandoned", ErrFenced))
}

// dbRenewer renews the replica's lease on the database's clock, on a
// connection of its own (opened again after a failure): a pool busy with
// claims, endings or a large takeover never delays a renewal.
type dbRenewer struct {
	r    *Replica
	mu   sync.Mutex
	conn *pgx.Conn
}

func (d *dbRenewer) renew(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn == nil || d.conn.IsClosed() {
		c, err := pgx.ConnectConfig(ctx, d.r.pool.Config().ConnConfig.Copy())
		if err != nil {
			return fmt.Errorf("renew the lease: connect: %w", err)
		}
		d.conn = c
	}
	tag, err := d.conn.Exec(ctx, `UPDATE leases SET renewed_at = now(),
			expires_at = now() + $2::bigint * interval '1 microsecond'
		WHERE epoch = $1 AND expires_at > now()`, d.r.epoch, d.r.lease.Microseconds())
	if err != nil {
		d.closeLocked()
		return fmt.Errorf("renew the lease: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("renew the lease of %s: %w", d.r.Owner(), ErrLeaseLost)
	}
	return nil
}

// close closes the renewal connection.
func (d *dbRenewer) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closeLocked()
}

func (d *dbRenewer) closeLocked() {
	if d.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = d.conn.Close(ctx)
		d.conn = nil
	}
}

// scrub removes rawURL's password from err's text; errors.Is and As still
// see err.
func scrub(err error, rawURL string) error {
	u, perr := url.Parse(rawURL)
	if perr != nil || u.User == nil {
		return err
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" || !strings.Contains(err.Error(), pw) {
		return err
	}
	return &scrubbed{msg: strings.ReplaceAll(err.Error(), pw, "[redacted]"), err: err}
}

type scrubbed struct {
	msg string
	err error
}

func (e *scrubbed) Error() string { return e.msg }
func (e *scrubbed) Unwrap() error { return e.err }
