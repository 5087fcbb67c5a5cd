package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/turnguard/turnguard/cluster/busauth"
	"github.com/turnguard/turnguard/cluster/natsbus"
	"github.com/turnguard/turnguard/cluster/pgcoord"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/store"
)

// takeoverFlush bounds how long a takeover waits for the stream to store
// the ends it exported before it calls Options.OnTakeover.
const takeoverFlush = 2 * time.Second

// awaitPreviousEnd bounds how long a claim waits for the previous owner's
// last event of the session to reach the stream (Exporter.AwaitEnded).
const awaitPreviousEnd = 2 * time.Second

// Options configure a replica. DatabaseURL, NATSURLs, ReplicaID, Lease,
// Notice and Auth are required.
type Options struct {
	DatabaseURL string // store.url (postgres://…); never shown in errors or logs
	NATSURLs    []string
	// NATS is how this replica authenticates to NATS (cluster.nats.*): its
	// credentials and TLS files. None: the URLs' own, if any.
	NATS NATSAuth
	// Auth signs the requests this replica forwards and verifies those it
	// serves (cluster.secret): a request without a valid signature of a
	// replica is refused, whatever its body says. Its replica id must be
	// ReplicaID.
	Auth           *busauth.Key
	ReplicaID      string
	Lease          time.Duration // cluster.leaseSeconds
	OutboxChannels []string
	OnOutbox       func(channel string)
	// Notice renders the interrupted notice of a turn taken over from a
	// dead replica (pgcoord.Options.Notice).
	Notice func(store.Turn) string
	// Resume, optional, dispatches a taken-over turn again
	// (pgcoord.Options.Resume, agents.defaults.resume).
	Resume func(t store.Turn, prev store.Resume, found bool, text string) (store.Resume, store.QueuedMessage, string, bool)
	// OnFenced is called, on a goroutine of its own, each time this
	// replica is fenced: it must stop its runs and publish nothing more of
	// them. Then the node joins again (RejoinAfter) for the turns that
	// start from then on.
	OnFenced func(err error)
	// RejoinAfter is how long a fenced replica waits before it joins the
	// database again as a new epoch (its fenced turns are a survivor's to
	// end), and the first wait between failed attempts (doubling, up to a
	// minute). Claims are refused as unavailable meanwhile. 0 means Lease;
	// negative, never (the replica stays fenced).
	RejoinAfter time.Duration
	// OnTakeover is called after this replica took a dead one's turns
	// over, once their Aborted events are exported.
	OnTakeover func(pgcoord.Takeover)
	Logger     *slog.Logger
	// StreamReplicas is how many NATS nodes keep the event stream and the
	// lease buckets; 0 means 3 when NATSURLs lists three servers or more,
	// else 1.
	StreamReplicas int
	// Claims is pgcoord.Options.Claims: this process's store's
	// (postgres.Store.Claims), told of every claim this replica commits.
	Claims *pgcoord.Claims
}

// NATSAuth is how a replica authenticates to NATS. At most one of
// CredsFile (a .creds file: JWT and nkey seed), NKeySeedFile (a file
// holding an nkey seed) and User/Password; CAFile, CertFile and KeyFile
// configure TLS (the servers' CA; a client certificate).
type NATSAuth struct {
	CredsFile, NKeySeedFile string
	User, Password          string // the password is a secret
	CAFile                  string
	CertFile, KeyFile       string
}

// options are the nats.Options of a; an error names a file, never a
// secret.
func (a NATSAuth) options() ([]nats.Option, error) {
	var o []nats.Option
	switch {
	case a.CredsFile != "":
		o = append(o, nats.UserCredentials(a.CredsFile))
	case a.NKeySeedFile != "":
		opt, err := nats.NkeyOptionFromSeed(a.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("read the NATS nkey seed file %s: %w", a.NKeySeedFile, err)
		}
		o = append(o, opt)
	case a.User != "":
		o = append(o, nats.UserInfo(a.User, a.Password))
	}
	if a.CAFile != "" {
		o = append(o, nats.RootCAs(a.CAFile))
	}
	if a.CertFile != "" || a.KeyFile != "" {
		o = append(o, nats.ClientCert(a.CertFile, a.KeyFile))
	}
	return o, nil
}

// Handler is the local engine as forwarded requests reach it:
// *gateway.Engine satisfies it.
type Handler interface {
	Send(ctx context.Context, req gateway.SendRequest) (gateway.Ack, error)
	Abort(ctx context.Context, sessionKey, runID string, reason event.StopReason, requester string, operator bool) (gateway.AbortResult, error)
	Resolve(ctx context.Context, req gateway.ResolveRequest) (gateway.ResolveResult, error)
	StopWith(ctx context.Context, req gateway.StopRequest) (gateway.StopResult, error)
	Status(sessionKey string) gateway.TurnStatus
}

// Node is one replica's gateway.Cluster. Its methods are safe for
// concurrent use.
type Node struct {
	opts Options
	log  *slog.Logger
	nc   *nats.Conn
	// natsClosed is closed by NATS's closed handler, which its client
	// calls after every earlier connection callback (they run in order):
	// Close waits for it, so nothing of the connection logs after Close.
	natsClosed chan struct{}
	cfg        natsbus.Config
	exp        *natsbus.Exporter               // this replica's events; its own Import skips them
	interest   *natsbus.Interest               // which sessions the other replicas show (Export's filter)
	held       sync.Map                        // session key → *heldEvents: a live turn's events nobody else wanted yet
	heldN      atomic.Int64                    // events held, all sessions
	tkx        *natsbus.Exporter               // the ends of the turns it took over: every Import delivers them
	coord      atomic.Pointer[pgcoord.Replica] // the current epoch; replaced when a fenced replica joins again

	rejoin chan struct{}  // a fence asks rejoinLoop for a new epoch
	quit   chan struct{}  // Close
	bg     sync.WaitGroup // rejoinLoop
	stopBG context.CancelFunc
	bgCtx  context.Context

	handler       atomic.Pointer[Handler]
	serveOnce     sync.Once
	serving       serving
	refused       atomic.Uint64 // requests refused for want of a valid signature
	refusedLogged atomic.Int64  // Unix ns of the last log line about them

	mu       sync.Mutex
	watchers map[*imported]struct{}
	closed   bool
}

var _ gateway.Cluster = (*Node)(nil)

// Start makes this gateway a replica: it connects to NATS (reconnecting
// without end), ensures the event stream, starts the exporter, and joins
// the database (a new lease epoch, surveying for dead replicas by itself).
// Call Serve once the engine runs, and Close at the end.
func Start(ctx context.Context, opts Options) (*Node, error) {
	switch {
	case opts.ReplicaID == "":
		return nil, errors.New("cluster node: no replica id")
	case opts.DatabaseURL == "":
		return nil, errors.New("cluster node: no database URL")
	case len(opts.NATSURLs) == 0:
		return nil, errors.New("cluster node: no NATS URLs")
	case opts.Notice == nil:
		return nil, errors.New("cluster node: no Notice for interrupted turns")
	case opts.Auth == nil || opts.Auth.Replica() != opts.ReplicaID:
		return nil, errors.New("cluster node: no signing key of this replica (cluster.secret)")
	}
	auth, err := opts.NATS.options()
	if err != nil {
		return nil, fmt.Errorf("cluster node %s: %w", opts.ReplicaID, err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.RejoinAfter == 0 {
		opts.RejoinAfter = opts.Lease
	}
	if opts.StreamReplicas <= 0 {
		opts.StreamReplicas = 1
		if len(opts.NATSURLs) >= 3 {
			opts.StreamReplicas = 3
		}
	}
	n := &Node{opts: opts, log: opts.Logger.With("replica", opts.ReplicaID),
		cfg: natsbus.Config{Replicas: opts.StreamReplicas}, watchers: map[*imported]struct{}{},
		rejoin: make(chan struct{}, 1), quit: make(chan struct{}), natsClosed: make(chan struct{})}
	n.nc, err = nats.Connect(strings.Join(opts.NATSURLs, ","), append(auth,
		nats.Name("turnguard "+opts.ReplicaID),
		// Replies come to this replica's own inbox subjects, which only it
		// may read (busauth.ReplicaUser).
		nats.CustomInboxPrefix(busauth.InboxPrefix(opts.ReplicaID)),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			// nil: this replica closed the connection (a clean shutdown) —
			// nothing went wrong, nothing to warn of.
			if err != nil {
				n.log.Warn("cluster: NATS disconnected", "error", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { n.log.Info("cluster: NATS reconnected") }),
		nats.ClosedHandler(func(*nats.Conn) { close(n.natsClosed) }))...)
	if err != nil {
		// The URLs may carry credentials: the error names none of them.
		return nil, fmt.Errorf("cluster node %s: connect to NATS (%d servers): %w", opts.ReplicaID, len(opts.NATSURLs), err)
	}
	xo := natsbus.ExporterOptions{Config: n.cfg, OnError: func(err error) {
		n.log.Warn("cluster: an event did not reach the stream (its watchers see a gap)", "error", err)
	}}
	if n.exp, err = natsbus.NewExporter(ctx, n.nc, xo); err == nil {
		xo.Buffer = 4096
		n.tkx, err = natsbus.NewExporter(ctx, n.nc, xo)
	}
	if err == nil {
		n.interest, err = natsbus.NewInterest(n.nc, natsbus.InterestOptions{Config: n.cfg, Replica: opts.ReplicaID,
			OnWanted: n.wanted, OnError: func(err error) { n.log.Warn("cluster: watch interest", "error", err) }})
	}
	if err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = n.closeExporters(cctx) // nothing was published
		n.nc.Close()
		return nil, fmt.Errorf("cluster node %s: %w", opts.ReplicaID, err)
	}
	coord, err := n.join(ctx)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		n.closeExporters(cctx)
		n.nc.Close()
		return nil, fmt.Errorf("cluster node %s: %w", opts.ReplicaID, err) // pgcoord scrubbed the password
	}
	n.coord.Store(coord)
	n.bgCtx, n.stopBG = context.WithCancel(context.Background())
	n.bg.Go(n.rejoinLoop)
	return n, nil
}

// join joins the database as a new epoch of this replica.
func (n *Node) join(ctx context.Context) (*pgcoord.Replica, error) {
	return pgcoord.JoinURL(ctx, n.opts.DatabaseURL, pgcoord.Options{
		ReplicaID:      n.opts.ReplicaID,
		Lease:          n.opts.Lease,
		OutboxChannels: n.opts.OutboxChannels,
		OnOutbox:       n.opts.OnOutbox,
		Notice:         n.opts.Notice,
		Resume:         n.opts.Resume,
		OnFenced:       n.fenced,
		OnTakeover:     n.tookOver,
		OnLeave:        n.left,
		Logger:         n.opts.Logger,
		Claims:         n.opts.Claims,
	})
}

// fenced tells Options.OnFenced that the current epoch is fenced, then
// asks rejoinLoop for a new one.
func (n *Node) fenced(err error) {
	// The fenced turns' events are never exported: forget what they held.
	n.held.Range(func(k, v any) bool {
		h := v.(*heldEvents)
		h.mu.Lock()
		n.clearLocked(h)
		h.mu.Unlock()
		n.held.Delete(k)
		return true
	})
	if n.opts.OnFenced != nil {
		n.opts.OnFenced(err)
	}
	select {
	case n.rejoin <- struct{}{}:
	default:
	}
}

// rejoinLoop joins the database again after each fence, RejoinAfter
// later, retrying until it succeeds or the node closes.
func (n *Node) rejoinLoop() {
	if n.opts.RejoinAfter < 0 {
		return
	}
	for {
		select {
		case <-n.quit:
			return
		case <-n.rejoin:
		}
		for wait := n.opts.RejoinAfter; ; wait = min(2*wait, time.Minute) {
			select {
			case <-n.quit:
				return
			case <-time.After(wait):
			}
			ctx, cancel := context.WithTimeout(n.bgCtx, 30*time.Second)
			r, err := n.join(ctx)
			cancel()
			if err != nil {
				n.log.Warn("cluster: cannot join again after the fence; retrying", "error", err, "in", 2*wait)
				continue
			}
			n.mu.Lock()
			closed := n.closed
			var old *pgcoord.Replica
			if !closed {
				old = n.coord.Swap(r)
			}
			n.mu.Unlock()
			lctx, lcancel := context.WithTimeout(context.Background(), n.opts.Lease)
			if closed {
				_ = r.Leave(lctx)
				lcancel()
				return
			}
			if err := old.Leave(lctx); err != nil { // fenced: it only stops and closes its pool
				n.log.Warn("cluster: close the fenced epoch", "error", err)
			}
			lcancel()
			n.log.Info("cluster: joined again after the fence", "epoch", r.Epoch())
			break
		}
	}
}

// Conn is the replica's NATS connection (the Telegram update stream uses
// it too). It stays the node's: Close closes it.
func (n *Node) Conn() *nats.Conn { return n.nc }

// Key is the replica's signing key (Options.Auth): the Telegram update
// stream signs and verifies with it too.
func (n *Node) Key() *busauth.Key { return n.opts.Auth }

// Coordinator is the replica's membership in the database, for outbox
// claims by the out-of-band channels.
func (n *Node) Coordinator() *pgcoord.Replica { return n.coord.Load() }

// Replica is this replica's id.
func (n *Node) Replica() string { return n.opts.ReplicaID }

// Close stops answering forwarded requests (waiting, until ctx ends, for
// those being answered), leaves the database (the lease ends at once; a
// turn still claimed is ended as interrupted), flushes the exporter, stops
// the Import watchers and closes NATS, waiting (until ctx ends) for the
// connection's last callbacks, so nothing of it logs after Close. It is safe
// to call more than once.
func (n *Node) Close(ctx context.Context) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	watchers := n.watchers
	n.watchers = nil
	n.mu.Unlock()
	var errs []error
	if err := n.serving.stop(ctx); err != nil {
		errs = append(errs, err)
	}
	close(n.quit)
	n.stopBG()
	n.bg.Wait()
	if err := n.coord.Load().Leave(ctx); err != nil {
		errs = append(errs, err)
	}
	n.interest.Close()
	if err := n.closeExporters(ctx); err != nil {
		errs = append(errs, err)
	}
	for w := range watchers {
		w.stop()
	}
	n.nc.Close()
	select {
	case <-n.natsClosed:
	case <-ctx.Done():
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cluster node %s: close: %w", n.opts.ReplicaID, err)
	}
	return nil
}

// closeExporters flushes and closes the exporters that exist.
func (n *Node) closeExporters(ctx context.Context) error {
	var errs []error
	for _, x := range []*natsbus.Exporter{n.exp, n.tkx} {
		if x != nil {
			if err := x.Close(ctx); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Claim reserves the session for the run on every replica (pgcoord.Claim).
func (n *Node) Claim(ctx context.Context, c gateway.ClaimRequest) error {
	prevMine, err := n.coord.Load().ClaimAfter(ctx, pgcoord.Claim{RunID: c.RunID, SessionKey: c.SessionKey, Channel: c.Channel,
		ChatRef: c.ChatRef, Text: c.Text, Joined: c.Joined,
		Limits: pgcoord.Limits{Deadline: c.Deadline, Ceiling: c.Ceiling, StepTimeout: c.StepTimeout, Sender: c.Sender}})
	if err == nil {
		// Another replica may have numbered the session's events since this
		// one last did: continue after them. Not when the session's last
		// turn was this epoch's own and ended by it — the common case, and
		// a renewal costs a stream lookup on the exporter's one goroutine
		// (under load, one per claim made every replica's events late).
		if !prevMine {
			// The previous owner records its turn's end before it exports
			// that end: wait until it is in the stream (bounded), or the
			// renewal would read the stream before it and number this
			// turn's first event over it.
			wctx, cancel := context.WithTimeout(ctx, awaitPreviousEnd)
			if err := n.exp.AwaitEnded(wctx, c.SessionKey); err != nil {
				n.log.Warn("the previous turn's last event of a session this replica claimed is not in the stream yet; its watchers may see a gap",
					"session", c.SessionKey, "run", c.RunID, "err", err)
			}
			cancel()
			n.exp.Renew(c.SessionKey)
		}
		return nil
	}
	if be, ok := errors.AsType[*pgcoord.BusyError](err); ok {
		return &gateway.HeldError{SessionKey: be.SessionKey, RunID: be.HolderRunID, Replica: be.HolderReplica}
	}
	if de, ok := errors.AsType[*pgcoord.DuplicateError](err); ok {
		// Outcome stays nil: the turn's row has its end, not its reply.
		return &gateway.RunExistsError{RunID: de.RunID, SessionKey: de.SessionKey, Running: de.State == store.TurnRunning,
			Replica: de.Replica, StopReason: de.StopReason}
	}
	if errors.Is(err, store.ErrInvalid) {
		return fmt.Errorf("cluster claim: %w", err)
	}
	if errors.Is(err, pgcoord.ErrFenced) {
		return fmt.Errorf("cluster claim: %w: %w", gateway.ErrLeaseLost, err)
	}
	return fmt.Errorf("cluster claim: %w: %w", gateway.ErrClusterUnavailable, err)
}

// Finish records the end of this replica's turn (pgcoord.Finish); a turn
// that is not this replica's any more (or unknown) wraps
// gateway.ErrNotTurnOwner.
func (n *Node) Finish(ctx context.Context, ev event.Event) error {
	err := n.coord.Load().Finish(ctx, ev)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgcoord.ErrStale), errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("cluster finish: %w: %w", gateway.ErrNotTurnOwner, err)
	}
	return fmt.Errorf("cluster finish: %w", err)
}

// Holder names the session's running turn and its replica; an error
// reaching the database wraps gateway.ErrClusterUnavailable.
func (n *Node) Holder(ctx context.Context, sessionKey string) (runID, replica string, ok bool, err error) {
	runID, replica, ok, err = n.coord.Load().Holder(ctx, sessionKey)
	if err != nil {
		return "", "", false, fmt.Errorf("cluster holder: %w: %w", gateway.ErrClusterUnavailable, err)
	}
	return runID, replica, ok, nil
}
