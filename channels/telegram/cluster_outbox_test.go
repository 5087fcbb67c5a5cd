package telegram

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/turnguard/turnguard/cluster/pgcoord"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/postgres"

	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/internal/testwait"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func interruptedNotice(t store.Turn) string { return "⚠️ interrupted: " + t.RunID }

// TestClusterOutboxDeliveredOnce: two replicas' channels share one
// PostgreSQL outbox and claim its rows through their pgcoord replicas. The
// interrupted notices a survivor writes for a dead replica's turns, and a
// row whose claimer died before sending it, each reach their chat once and
// are recorded as delivered.
// pgOutbox is a PostgreSQL outbox shared by replicas' channels, as in a
// cluster: the store, its URL and the test's logs.
type pgOutbox struct {
	url  string
	st   *postgres.Store
	log  *slog.Logger
	logs *syncBuffer
}

// newPGOutbox opens a fresh PostgreSQL database's store; the logs are
// shown if the test fails.
func newPGOutbox(t *testing.T) *pgOutbox {
	t.Helper()
	url := pgtest.New(t)
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", logs.String())
		}
	})
	st, err := postgres.Open(context.Background(), url, postgres.Options{Shared: true, Logger: log, OutboxChannels: []string{config.ChannelTelegram}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return &pgOutbox{url: url, st: st, log: log, logs: logs}
}

// join makes a replica named id join the cluster (a new epoch); it leaves
// when the test ends.
func (p *pgOutbox) join(t *testing.T, id string) *pgcoord.Replica {
	t.Helper()
	r, err := pgcoord.JoinURL(context.Background(), p.url, pgcoord.Options{ReplicaID: id, Lease: 2 * time.Second, Notice: interruptedNotice,
		OutboxChannels: []string{config.ChannelTelegram}, Logger: p.log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Leave(context.Background()) })
	return r
}

// channel starts replica r's engine and Telegram channel on the shared
// outbox, sending through tr; both stop when the test ends.
func (p *pgOutbox) channel(t *testing.T, r *pgcoord.Replica, tr *memTransport) *Channel {
	t.Helper()
	return p.channelWith(t, r.ID(), r, tr)
}

// channelWith is channel with claims standing in front of the replica id.
func (p *pgOutbox) channelWith(t *testing.T, id string, claims OutboxClaims, tr *memTransport) *Channel {
	t.Helper()
	src := config.NewSource(testConfig(nil))
	d := demo.New()
	eng, err := gateway.New(gateway.Options{Config: src, Runners: map[string]runner.Runner{"demo": d}, Log: p.log})
	if err != nil {
		t.Fatal(err)
	}
	eng.Start(context.Background())
	ch, err := New(eng, src, Options{Log: p.log.With("replica", id), Outbox: p.st, DurableEndings: true,
		HTTPClient: &http.Client{Transport: tr},
		Cluster:    &Cluster{ReplicaID: id, Claims: claims, ClaimEvery: 100 * time.Millisecond, ClaimHold: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Release()
		eng.Shutdown(context.Background())
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := ch.Close(cctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return ch
}

// waitDelivered waits until the outbox rows ids (every row when none is
// named) are delivered.
func (p *pgOutbox) waitDelivered(t *testing.T, ids ...int64) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), p.url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	testwait.NoError(t, clusterWait, func() error {
		var pending int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox
			WHERE delivered_at IS NULL AND (coalesce(cardinality($1::bigint[]), 0) = 0 OR id = ANY($1))`, ids).Scan(&pending); err != nil {
			return err
		}
		if pending != 0 {
			return fmt.Errorf("%d outbox rows not delivered", pending)
		}
		return nil
	})
}

// TestClusterOutboxDeliveredOnce: two replicas' channels share one
// PostgreSQL outbox and claim its rows through their pgcoord replicas. The
// interrupted notices a survivor writes for a dead replica's turns, and a
// row whose claimer died before sending it, each reach their chat once and
// are recorded as delivered.
func TestClusterOutboxDeliveredOnce(t *testing.T) {
	ctx := context.Background()
	p := newPGOutbox(t)
	st, logs := p.st, p.logs
	join := func(id string) *pgcoord.Replica { t.Helper(); return p.join(t, id) }
	a, b := join("a"), join("b")

	// Replica c runs three chats' turns, then dies: its restart supersedes
	// the epoch, and a survivor takes the turns over, writing their
	// interrupted notices to the outbox.
	dead := join("c")
	chats := []int64{alice, bob, 1003}
	for _, chat := range chats {
		if err := dead.Claim(ctx, pgcoord.Claim{RunID: runOf(chat), SessionKey: SessionKey(chat), Channel: config.ChannelTelegram,
			ChatRef: chatRef(chat), Text: "hello"}); err != nil {
			t.Fatal(err)
		}
	}
	restarted := join("c")
	took, err := a.Survey(ctx)
	if err != nil || len(took) != 1 || len(took[0].Turns) != len(chats) {
		t.Fatalf("Survey = %+v, %v; want the dead epoch's %d turns", took, err, len(chats))
	}
	// A reply whose claimer dies before sending it: its hold runs out.
	if _, err := st.Enqueue(ctx, store.OutboxMessage{Channel: config.ChannelTelegram, ChatRef: chatRef(1004), RunID: "tg-1004-1",
		Kind: store.OutboxFinal, Text: "the held reply"}); err != nil {
		t.Fatal(err)
	}
	held, err := restarted.ClaimOutbox(ctx, config.ChannelTelegram, 10, 500*time.Millisecond)
	if err != nil || len(held) != len(chats)+1 {
		t.Fatalf("the doomed claim took %d rows, %v; want %d", len(held), err, len(chats)+1)
	}

	api := newFakeAPI(testToken)
	var trs []*memTransport
	for _, r := range []*pgcoord.Replica{a, b} {
		tr := &memTransport{h: api}
		trs = append(trs, tr)
		p.channel(t, r, tr)
	}

	p.waitDelivered(t)
	for _, chat := range chats {
		if got, want := api.screen(chat), []string{"⚠️ interrupted: " + runOf(chat)}; !slices.Equal(got, want) {
			t.Errorf("chat %d shows %q; want %q", chat, got, want)
		}
	}
	if got := api.screen(1004); !slices.Equal(got, []string{"the held reply"}) {
		t.Errorf("chat 1004 shows %q; want the held reply once", got)
	}
	if n := trs[0].sendCount() + trs[1].sendCount(); n != len(chats)+1 {
		t.Errorf("%d messages sent; want %d", n, len(chats)+1)
	}
	if strings.Contains(logs.String(), testToken) {
		t.Error("the bot token is in the logs")
	}
}

func runOf(chat int64) string { return "tg-" + chatRef(chat) + "-1" }

func chatRef(chat int64) string { return SessionKey(chat)[len("telegram:"):] }
