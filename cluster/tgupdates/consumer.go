package tgupdates

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnguard/turnguard/cluster/jsstream"
)

// Update is one stored update as a handler receives it.
type Update struct {
	ID, ChatID int64
	// Raw is the update's JSON as it was published.
	Raw []byte
	// Partition is the chat's partition.
	Partition int
	// Delivery is 1 on the first delivery; more when an earlier delivery
	// was not acknowledged (its replica died mid-update, its handler
	// failed, or the acknowledgement was lost).
	Delivery uint64
}

// Handler handles one update. The update is acknowledged after it returns
// nil; an error has it delivered again after ConsumerOptions.RetryDelay
// (the partition waits: later updates of its chats are not handled first).
// It must be idempotent (see the package doc). Its context is not
// cancelled when the Consumer stops: the update in hand is finished, so a
// clean stop hands nothing over half done.
type Handler func(ctx context.Context, u Update) error

// ConsumerOptions tune a Consumer. AckWait, PinnedTTL and MaxDeliver are
// part of each partition's consumer on the server: every replica must use
// the same.
type ConsumerOptions struct {
	// ReplicaID names this replica among the others; unique per process,
	// a valid KV key (letters, digits, '-', '_'). Required.
	ReplicaID string
	// MemberTTL: a replica that stops renewing its membership for this
	// long counts as gone, and its partitions go to the others. Default 5 s.
	MemberTTL time.Duration
	// PinnedTTL: a pinned replica that stops pulling for this long loses
	// its pin. At least 2 s (a pull lasts PinnedTTL/2, and at least 1 s).
	// Default 5 s.
	PinnedTTL time.Duration
	// AckWait: an update not acknowledged for this long is delivered again;
	// while a handler runs it is extended every AckWait/3. Default 10 s.
	AckWait time.Duration
	// MaxDeliver bounds the deliveries of one update; past it the server
	// gives the update up (reported to OnError) so its partition moves on.
	// Default 10.
	MaxDeliver int
	// RetryDelay is the wait before an update whose handler failed is
	// delivered again. Default 1 s.
	RetryDelay time.Duration
	// OnError, if set, is called with what the consumer retries past or
	// gives up (a *HandlerError for a handler's error); it must not block.
	OnError func(error)
	// OnAssign, if set, is called with the partitions this replica
	// consumes whenever they change; it must not block.
	OnAssign func(partitions []int)
}

func (o ConsumerOptions) withDefaults() (ConsumerOptions, error) {
	if o.ReplicaID == "" {
		return o, errors.New("tgupdates: ReplicaID required")
	}
	if o.MemberTTL <= 0 {
		o.MemberTTL = 5 * time.Second
	}
	if o.PinnedTTL <= 0 {
		o.PinnedTTL = 5 * time.Second
	}
	if o.PinnedTTL < 2*time.Second {
		return o, fmt.Errorf("tgupdates: PinnedTTL %v below 2 s", o.PinnedTTL)
	}
	if o.AckWait <= 0 {
		o.AckWait = 10 * time.Second
	}
	if o.MaxDeliver <= 0 {
		o.MaxDeliver = 10
	}
	if o.RetryDelay <= 0 {
		o.RetryDelay = time.Second
	}
	return o, nil
}

// HandlerError reports a handler's error for an update.
type HandlerError struct {
	Update Update
	// GivenUp: this was the last delivery (MaxDeliver); the update will
	// not be handled.
	GivenUp bool
	Err     error
}

func (e *HandlerError) Error() string {
	s := fmt.Sprintf("tgupdates: update %d (chat %d, delivery %d)", e.Update.ID, e.Update.ChatID, e.Update.Delivery)
	if e.GivenUp {
		s += " given up"
	}
	return s + ": " + e.Err.Error()
}

func (e *HandlerError) Unwrap() error { return e.Err }

// priorityGroup is the one priority group of every partition's consumer.
const priorityGroup = "replicas"

// Consumer is one replica's share of the partitions.
type Consumer struct {
	cfg     Config
	opt     ConsumerOptions
	js      jetstream.JetStream
	stream  jetstream.Stream
	members jetstream.KeyValue
	h       Handler

	mu    sync.Mutex
	owned []int
	done  chan struct{}

	refused         atomic.Uint64 // updates Config.Verify refused
	refusedReported atomic.Int64  // Unix ns of the last report of one
}

// Refused is how many updates this replica refused for want of a valid
// signature (Config.Verify).
func (c *Consumer) Refused() uint64 { return c.refused.Load() }

// Consume ensures the stream, one durable consumer per partition and the
// membership bucket (<Stream>_members), and starts this replica's
// consumption: it joins the members, consumes the partitions assigned to
// it (a balanced rendezvous of partitions over the live members, so every
// replica computes the same assignment and a partition moves only when
// membership changes), and re-reads membership every MemberTTL/4. It
// returns at once; consumption runs until ctx ends, when the replica
// finishes the updates in hand, releases its pins and leaves the members,
// so the others take over without waiting for TTLs. Done is closed then.
//
// A partition is consumed by one replica at a time even while replicas
// disagree about membership: its consumer is pinned to one client, and
// delivers one update at a time.
func Consume(ctx context.Context, nc *nats.Conn, cfg Config, h Handler, opt ConsumerOptions) (*Consumer, error) {
	cfg = cfg.withDefaults()
	opt, err := opt.withDefaults()
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("tgupdates: %w", err)
	}
	s, err := EnsureStream(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	for p := range cfg.Partitions {
		_, err := jsstream.Consumer(ctx, s, jetstream.ConsumerConfig{
			Durable:        consumerName(p),
			Description:    "turnguard: one partition of the Telegram updates, pinned to one replica",
			FilterSubject:  cfg.subject(p),
			AckPolicy:      jetstream.AckExplicitPolicy,
			AckWait:        opt.AckWait,
			MaxAckPending:  1,
			MaxDeliver:     opt.MaxDeliver,
			DeliverPolicy:  jetstream.DeliverAllPolicy,
			PriorityPolicy: jetstream.PriorityPolicyPinned,
			PriorityGroups: []string{priorityGroup},
			PinnedTTL:      opt.PinnedTTL,
		})
		if err != nil {
			return nil, fmt.Errorf("tgupdates: ensure consumer %s: %w", consumerName(p), err)
		}
	}
	kv, err := jsstream.KeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:      cfg.Stream + "_members",
		Description: "turnguard: the replicas consuming the Telegram updates (cluster/tgupdates)",
		History:     1,
		TTL:         opt.MemberTTL,
		Storage:     jetstream.MemoryStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("tgupdates: ensure the members bucket: %w", err)
	}
	c := &Consumer{cfg: cfg, opt: opt, js: js, stream: s, members: kv, h: h, done: make(chan struct{})}
	if _, err := kv.Put(ctx, opt.ReplicaID, []byte(opt.ReplicaID)); err != nil {
		return nil, fmt.Errorf("tgupdates: join as %q: %w", opt.ReplicaID, err)
	}
	go c.run(ctx)
	return c, nil
}

func consumerName(p int) string { return "upd-" + strconv.Itoa(p) }

// Partitions returns the partitions this replica consumes now, ascending.
func (c *Consumer) Partitions() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.owned)
}

// Done is closed when consumption has stopped (see Consume).
func (c *Consumer) Done() <-chan struct{} { return c.done }

func (c *Consumer) report(err error) {
	if c.opt.OnError != nil && err != nil {
		c.opt.OnError(err)
	}
}

type worker struct {
	stop context.CancelFunc
	done chan struct{}
}

func (c *Consumer) run(ctx context.Context) {
	defer close(c.done)
	workers := map[int]*worker{}
	every := c.opt.MemberTTL / 4
	for {
		if members, err := c.refresh(ctx); err != nil {
			if ctx.Err() == nil {
				c.report(err)
			}
		} else {
			c.apply(ctx, workers, assign(members, c.cfg.Partitions))
		}
		tm := time.NewTimer(every)
		select {
		case <-ctx.Done():
			tm.Stop()
			for _, w := range workers {
				w.stop()
			}
			for _, w := range workers {
				<-w.done
			}
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_ = c.members.Delete(lctx, c.opt.ReplicaID)
			cancel()
			return
		case <-tm.C:
		}
	}
}

// refresh renews this replica's membership and reads the live members.
func (c *Consumer) refresh(ctx context.Context) ([]string, error) {
	rctx, cancel := context.WithTimeout(ctx, c.opt.MemberTTL/2)
	defer cancel()
	if _, err := c.members.Put(rctx, c.opt.ReplicaID, []byte(c.opt.ReplicaID)); err != nil {
		return nil, fmt.Errorf("tgupdates: renew membership of %q: %w", c.opt.ReplicaID, err)
	}
	keys, err := c.members.Keys(rctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, fmt.Errorf("tgupdates: read members: %w", err)
	}
	if !slices.Contains(keys, c.opt.ReplicaID) {
		keys = append(keys, c.opt.ReplicaID)
	}
	slices.Sort(keys)
	return keys, nil
}

// apply starts workers for the partitions owner gives this replica and
// stops the others (each finishes its update in hand and unpins).
func (c *Consumer) apply(ctx context.Context, workers map[int]*worker, owner []string) {
	var mine []int
	for p, m := range owner {
		if m == c.opt.ReplicaID {
			mine = append(mine, p)
		}
	}
	for p, w := range workers {
		if !slices.Contains(mine, p) {
			w.stop()
			delete(workers, p)
		}
	}
	for _, p := range mine {
		if workers[p] == nil {
			wctx, stop := context.WithCancel(ctx)
			w := &worker{stop: stop, done: make(chan struct{})}
			workers[p] = w
			go func() {
				defer close(w.done)
				c.work(wctx, p)
			}()
		}
	}
	c.mu.Lock()
	changed := !slices.Equal(c.owned, mine)
	c.owned = mine
	c.mu.Unlock()
	if changed && c.opt.OnAssign != nil {
		c.opt.OnAssign(slices.Clone(mine))
	}
}

// work consumes partition p until ctx ends, then releases its pin.
func (c *Consumer) work(ctx context.Context, p int) {
	for ctx.Err() == nil {
		pin := c.consume(ctx, p)
		if pin != "" {
			c.unpin(ctx, p, pin)
		}
		if ctx.Err() == nil {
			tm := time.NewTimer(c.opt.RetryDelay)
			select {
			case <-ctx.Done():
			case <-tm.C:
			}
			tm.Stop()
		}
	}
}

// consume pulls partition p's updates one at a time until ctx ends or the
// pull fails; it returns the pin id it last held ("" if none).
func (c *Consumer) consume(ctx context.Context, p int) (pin string) {
	cons, err := c.stream.Consumer(ctx, consumerName(p))
	if err != nil {
		if ctx.Err() == nil {
			c.report(fmt.Errorf("tgupdates: partition %d: %w", p, err))
		}
		return ""
	}
	it, err := cons.Messages(jetstream.PullPriorityGroup(priorityGroup), jetstream.PullMaxMessages(1),
		jetstream.PullExpiry(c.opt.PinnedTTL/2))
	if err != nil {
		c.report(fmt.Errorf("tgupdates: partition %d: %w", p, err))
		return ""
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				c.report(fmt.Errorf("tgupdates: partition %d: %w", p, err))
			}
			if ctx.Err() == nil && !errors.Is(err, jetstream.ErrMsgIteratorClosed) && !errors.Is(err, jetstream.ErrConnectionClosed) {
				continue // a missed heartbeat or a pin handed elsewhere: keep pulling
			}
			return pin
		}
		if id := msg.Headers().Get("Nats-Pin-Id"); id != "" {
			pin = id
		}
		c.handle(ctx, p, msg)
	}
}

// handle runs the handler on msg with its acknowledgement deadline
// extended while it runs, then acknowledges it (waiting for the server's
// confirmation) or has it delivered again.
func (c *Consumer) handle(ctx context.Context, p int, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		c.report(fmt.Errorf("tgupdates: partition %d: %w", p, err))
		_ = msg.Term()
		return
	}
	u := Update{Raw: msg.Data(), Partition: p, Delivery: meta.NumDelivered}
	var e1, e2 error
	u.ID, e1 = strconv.ParseInt(msg.Headers().Get(HeaderUpdateID), 10, 64)
	u.ChatID, e2 = strconv.ParseInt(msg.Headers().Get(HeaderChatID), 10, 64)
	if e1 != nil || e2 != nil {
		c.report(fmt.Errorf("tgupdates: partition %d, stream sequence %d: %w", p, meta.Sequence.Stream, errBadHeaders))
		_ = msg.Term()
		return
	}
	if c.cfg.Verify != nil {
		if err := c.cfg.Verify(msg.Subject(), msg.Headers(), msg.Data(), boundHeaders...); err != nil {
			total := c.refused.Add(1)
			now := time.Now().UnixNano()
			if last := c.refusedReported.Load(); now-last >= int64(RefusedReportEvery) && c.refusedReported.CompareAndSwap(last, now) {
				c.report(fmt.Errorf("tgupdates: partition %d: refused update %d (chat %d), not written by a replica (%d refused so far): %w",
					p, u.ID, u.ChatID, total, err))
			}
			_ = msg.Term()
			return
		}
	}
	hctx := context.WithoutCancel(ctx) // the update in hand is finished (see Handler)
	beat := make(chan struct{})
	go func() {
		t := time.NewTicker(c.opt.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-beat:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	herr := c.h(hctx, u)
	close(beat)
	if herr != nil {
		last := int(meta.NumDelivered) >= c.opt.MaxDeliver
		c.report(&HandlerError{Update: u, GivenUp: last, Err: herr})
		_ = msg.NakWithDelay(c.opt.RetryDelay)
		return
	}
	actx, cancel := context.WithTimeout(hctx, c.opt.AckWait/2)
	defer cancel()
	if err := msg.DoubleAck(actx); err != nil {
		// Unconfirmed: it may be delivered again (at least once).
		c.report(fmt.Errorf("tgupdates: acknowledge update %d: %w", u.ID, err))
	}
}

// unpin releases partition p's pin if this replica still holds it, so the
// next owner need not wait for PinnedTTL.
func (c *Consumer) unpin(ctx context.Context, p int, pin string) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	cons, err := c.stream.Consumer(uctx, consumerName(p))
	if err != nil {
		return
	}
	info := cons.CachedInfo()
	for _, g := range info.PriorityGroups {
		if g.Group == priorityGroup && g.PinnedClientID == pin {
			if err := c.stream.UnpinConsumer(uctx, consumerName(p), priorityGroup); err != nil {
				c.report(fmt.Errorf("tgupdates: unpin partition %d: %w", p, err))
			}
		}
	}
}

// assign gives each of n partitions to one of members (sorted, unique):
// rendezvous hashing with bounded load — each partition goes to the member
// with the highest hash of (member, partition) among those that may take
// one more (n/len(members) each, one more for n%len(members) of them).
// Every replica computes the same answer from the same member list.
func assign(members []string, n int) []string {
	owner := make([]string, n)
	if len(members) == 0 {
		return owner
	}
	floor, extra := n/len(members), n%len(members)
	load := map[string]int{}
	full := 0 // members at floor+1
	for p := range n {
		var best string
		var bestScore uint64
		for _, m := range members {
			if l := load[m]; l > floor || (l == floor && full >= extra) {
				continue
			}
			h := fnv.New64a()
			h.Write([]byte(m))
			h.Write([]byte{0, byte(p >> 8), byte(p)})
			if s := h.Sum64(); best == "" || s > bestScore {
				best, bestScore = m, s
			}
		}
		owner[p] = best
		load[best]++
		if load[best] == floor+1 {
			full++
		}
	}
	return owner
}
