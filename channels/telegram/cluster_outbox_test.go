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
func TestClusterOutboxDeliveredOnce(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", logs.String())
		}
	})
	st, err := postgres.Open(ctx, url, postgres.Options{Shared: true, Logger: log, OutboxChannels: []string{config.ChannelTelegram}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	join := func(id string) *pgcoord.Replica {
		t.Helper()
		r, err := pgcoord.JoinURL(ctx, url, pgcoord.Options{ReplicaID: id, Lease: 2 * time.Second, Notice: interruptedNotice,
			OutboxChannels: []string{config.ChannelTelegram}, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Leave(context.Background()) })
		return r
	}
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
		src := config.NewSource(testConfig(nil))
		d := demo.New()
		eng, err := gateway.New(gateway.Options{Config: src, Runners: map[string]runner.Runner{"demo": d}, Log: log})
		if err != nil {
			t.Fatal(err)
		}
		eng.Start(ctx)
		ch, err := New(eng, src, Options{Log: log.With("replica", r.ID()), Outbox: st, DurableEndings: true,
			HTTPClient: &http.Client{Transport: tr},
			Cluster:    &Cluster{ReplicaID: r.ID(), Claims: r, ClaimEvery: 100 * time.Millisecond, ClaimHold: 5 * time.Second}})
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
	}

	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	testwait.NoError(t, clusterWait, func() error {
		var pending int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE delivered_at IS NULL`).Scan(&pending); err != nil {
			return err
		}
		if pending != 0 {
			return fmt.Errorf("%d outbox rows not delivered", pending)
		}
		return nil
	})
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
