package telegram

import (
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
	"github.com/turnguard/turnguard/store"
)

// claimBoard is the cluster's outbox claims (pgcoord.ClaimOutbox) over one
// outbox: a row is held by one replica until its hold ends or it is handed
// back.
type claimBoard struct {
	mu   sync.Mutex
	out  Outbox
	held map[int64]rowHold
}

type rowHold struct {
	owner string
	until time.Time
}

// claimer is one replica's view of the board.
type claimer struct {
	b     *claimBoard
	owner string
}

func (c claimer) ClaimOutbox(ctx context.Context, channel string, limit int, hold time.Duration) ([]store.OutboxMessage, error) {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	rows, err := c.b.out.Pending(ctx, channel, limit)
	if err != nil {
		return nil, err
	}
	var out []store.OutboxMessage
	for _, m := range rows {
		if h, ok := c.b.held[m.ID]; ok && h.owner != c.owner && time.Now().Before(h.until) {
			continue
		}
		c.b.held[m.ID] = rowHold{owner: c.owner, until: time.Now().Add(hold)}
		out = append(out, m)
	}
	return out, nil
}

// HoldOutbox is pgcoord's: the row must still be this replica's, and the
// first pending row of its chat.
func (c claimer) HoldOutbox(ctx context.Context, id int64, hold time.Duration) error {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	if h, ok := c.b.held[id]; !ok || h.owner != c.owner || !time.Now().Before(h.until) {
		return store.ErrNotHeld
	}
	rows, err := c.b.out.Pending(ctx, "", maxPendingRows)
	if err != nil {
		return err
	}
	var chat string
	for _, m := range rows {
		if m.ID == id {
			chat = m.ChatRef
		}
	}
	if chat == "" {
		return store.ErrNotHeld // delivered or failed meanwhile
	}
	for _, m := range rows {
		if m.ChatRef == chat {
			if m.ID != id {
				return store.ErrBehind
			}
			break
		}
	}
	c.b.held[id] = rowHold{owner: c.owner, until: time.Now().Add(hold)}
	return nil
}

// maxPendingRows is more pending rows than any test writes.
const maxPendingRows = 1000

func (c claimer) ReleaseOutbox(_ context.Context, ids ...int64) error {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	for _, id := range ids {
		if c.b.held[id].owner == c.owner {
			delete(c.b.held, id)
		}
	}
	return nil
}

// TestClusterEndingSentByItsReplica: another replica claiming the outbox
// right when a turn's ending is written does not send it: the turn's own
// replica does, promptly (its chat holds the ending's place), and no other
// replica sends anything. A row no live replica's turn wrote is sent by
// one replica ClaimEvery after it first saw it.
func TestClusterEndingSentByItsReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const every = 2 * time.Second
		d := openStore(t, filepath.Join(t.TempDir(), "turnguard.db"))
		board := &claimBoard{out: d.st, held: map[int64]rowHold{}}
		// No Run: receiving needs NATS; the update is handed to the chat
		// as the update consumer would.
		h := newHarness(t, setup{store: d, noRun: true, cluster: &Cluster{ReplicaID: "a", Claims: claimer{board, "a"}, ClaimEvery: every}})

		// Replica b: its own engine, the same outbox and Bot API.
		src := config.NewSource(testConfig(nil))
		dm := demo.New()
		eng, err := gateway.New(gateway.Options{Config: src, Runners: map[string]runner.Runner{"demo": dm}, Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		eng.Start(context.Background())
		trB := &memTransport{h: h.api}
		b, err := New(eng, src, Options{Log: slog.New(slog.NewTextHandler(h.logs, nil)).With("replica", "b"), Outbox: d.st, DurableEndings: true,
			HTTPClient: &http.Client{Transport: trB},
			Cluster:    &Cluster{ReplicaID: "b", Claims: claimer{board, "b"}, ClaimEvery: every}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			dm.Release()
			eng.Shutdown(context.Background())
			if err := b.Close(context.Background()); err != nil {
				t.Errorf("b: Close: %v", err)
			}
		})
		// The store tells b, not a, that an ending was written: b claims
		// first.
		d.claim.Store(b)

		u := userText(alice, "/steps say:hello")
		u.Message.ID = 1
		h.ch.dispatch(&u)
		synctest.Wait()
		h.advance(every + time.Second)
		h.wantScreen(alice, "hello")
		if n := trB.sendCount(); n != 0 {
			t.Errorf("replica b sent %d messages; want none (the turn is a's)", n)
		}

		// A row whose writer is gone (a takeover's notice): one replica
		// sends it, once, a few claim periods later (seen at one claim,
		// left to its writer for two).
		if _, err := d.st.Enqueue(context.Background(), store.OutboxMessage{Channel: config.ChannelTelegram, ChatRef: "1002",
			RunID: "tg-1002-9", Kind: store.OutboxNotice, Text: "interrupted"}); err != nil {
			t.Fatal(err)
		}
		h.advance(5 * every)
		h.wantScreen(bob, "interrupted")
	})
}
