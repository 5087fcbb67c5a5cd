package telegram

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/store"

	"github.com/turnguard/turnguard/internal/testwait"
)

// enqueueAll writes a final reply for each of texts to chat's outbox, in
// order, as turns tg-<chat>-1, -2, …; it returns the rows' ids.
func (p *pgOutbox) enqueueAll(t *testing.T, chat int64, texts ...string) []int64 {
	t.Helper()
	var ids []int64
	for i, text := range texts {
		id, err := p.st.Enqueue(context.Background(), store.OutboxMessage{Channel: config.ChannelTelegram, ChatRef: chatRef(chat),
			RunID: fmt.Sprintf("tg-%s-%d", chatRef(chat), i+1), Kind: store.OutboxFinal, Text: text})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// holdFirstSend makes the first sendMessage through tr wait, once it
// reached the transport (reached is closed), until release is closed; then
// the Bot API accepts it.
func holdFirstSend(tr *memTransport) (reached, release chan struct{}) {
	reached, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	tr.setFail(func(req *http.Request) error {
		if strings.HasSuffix(req.URL.Path, "/sendMessage") {
			once.Do(func() { close(reached); <-release })
		}
		return nil
	})
	return reached, release
}

// waitReached waits until the held send of who reached the transport.
func waitReached(t *testing.T, reached <-chan struct{}, who string) {
	t.Helper()
	select {
	case <-reached:
	case <-time.After(clusterWait):
		t.Fatalf("%s sent nothing", who)
	}
}

// TestClusterFencedReplicaSendsNothingItHeld: replica c claimed a chat's
// replies and is sending the first message when it is fenced (its epoch
// superseded, a survivor takes its claims over). That message was accepted
// by Telegram; nothing else c holds is sent by c — neither the replies
// queued behind it nor the later parts of a long reply — the survivor
// sends them, each once, in order (issue 20, defect 9: the fenced replica
// sent them too, after the survivor).
func TestClusterFencedReplicaSendsNothingItHeld(t *testing.T) {
	long := strings.Repeat(strings.Repeat("x", 40)+"_", 150) // two messages
	for _, tc := range []struct {
		name    string
		replies []string
		screen  int // messages the chat shows in the end
	}{
		{name: "replies queued behind", replies: []string{"first", "second", "third"}, screen: 3},
		{name: "a long reply's later part", replies: []string{long, "after"}, screen: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			p := newPGOutbox(t)
			a, doomed := p.join(t, "a"), p.join(t, "c")
			p.enqueueAll(t, alice, tc.replies...)

			api := newFakeAPI(testToken)
			trC := &memTransport{h: api}
			reached, release := holdFirstSend(trC)
			chC := p.channel(t, doomed, trC)
			waitReached(t, reached, "replica c")
			// c is fenced while its first message is on its way: its
			// restart supersedes the epoch, and a survivor takes its
			// claims over.
			p.join(t, "c")
			if _, err := a.Survey(ctx); err != nil {
				t.Fatal(err)
			}
			close(release)
			testwait.Until(t, clusterWait, "the first message reaches the chat", func() bool { return len(api.screen(alice)) > 0 })
			cctx, cancel := context.WithTimeout(ctx, clusterWait)
			defer cancel()
			if err := chC.Close(cctx); err != nil {
				t.Fatal(err)
			}

			trA := &memTransport{h: api}
			p.channel(t, a, trA)
			p.waitDelivered(t)
			scr := api.screen(alice)
			if len(scr) != tc.screen || scr[len(scr)-1] != tc.replies[len(tc.replies)-1] {
				t.Errorf("chat shows %d messages %.30q; want %d, ending with the last reply", len(scr), scr, tc.screen)
			}
			if n := trC.sendCount(); n != 1 {
				t.Errorf("the fenced replica sent %d messages; want 1 (the one on its way when it was fenced)", n)
			}
		})
	}
}

// TestClusterChatRowsInOrderAcrossReplicas: replica a claimed a chat's
// reply and is slow to send it (its hold runs out); the chat's next reply
// is replica b's own turn's. b does not send it before the earlier one:
// the chat reads them in order (issue 20, defect 10: the later reply went
// first).
func TestClusterChatRowsInOrderAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	p := newPGOutbox(t)
	a, b := p.join(t, "a"), p.join(t, "b")
	p.enqueueAll(t, alice, "first")
	if held, err := a.ClaimOutbox(ctx, config.ChannelTelegram, 10, time.Second); err != nil || len(held) != 1 {
		t.Fatalf("a claimed %d rows, %v; want the first reply", len(held), err)
	}
	if _, err := p.st.Enqueue(ctx, store.OutboxMessage{Channel: config.ChannelTelegram, ChatRef: chatRef(alice),
		RunID: "tg-1001-2", Kind: store.OutboxFinal, Text: "second"}); err != nil {
		t.Fatal(err)
	}
	api := newFakeAPI(testToken)
	chB := p.channel(t, b, &memTransport{h: api})
	chB.Adopt("tg-1001-2") // b's own turn: its reply is b's to send at once
	p.waitDelivered(t)
	if got, want := api.screen(alice), []string{"first", "second"}; !slices.Equal(got, want) {
		t.Errorf("chat shows %q; want %q", got, want)
	}
}

// countedClaims counts a replica's claims.
type countedClaims struct {
	OutboxClaims
	n *atomic.Int32
}

func (c countedClaims) ClaimOutbox(ctx context.Context, channel string, limit int, hold time.Duration) ([]store.OutboxMessage, error) {
	defer c.n.Add(1)
	return c.OutboxClaims.ClaimOutbox(ctx, channel, limit, hold)
}

// TestClusterOneSenderPerChat: replicas a and b each have a reply of one
// chat to send, their own turns' (as after a NATS node's death moved the
// chat's partition while a turn ran). While a's earlier reply is on its
// way, b sends nothing to the chat, through many claims (a holds the
// chat's rows); the later reply goes after the earlier one, once (issue
// 20, defect 10: both were sent at once, out of order).
func TestClusterOneSenderPerChat(t *testing.T) {
	p := newPGOutbox(t)
	a, b := p.join(t, "a"), p.join(t, "b")
	api := newFakeAPI(testToken)
	trA := &memTransport{h: api}
	reached, release := holdFirstSend(trA)
	chA := p.channel(t, a, trA)
	chA.Adopt("tg-1001-1")
	var claimsB atomic.Int32
	trB := &memTransport{h: api}
	chB := p.channelWith(t, b.ID(), countedClaims{b, &claimsB}, trB)
	chB.Adopt("tg-1001-2")
	p.enqueueAll(t, alice, "first", "second")
	chA.Claim()
	waitReached(t, reached, "replica a")
	chB.Claim()
	n := claimsB.Load()
	testwait.Until(t, clusterWait, "b claims five more times", func() bool { return claimsB.Load() >= n+5 })
	if got := trB.sendCount(); got != 0 {
		t.Errorf("b sent %d messages while a's earlier reply was on its way; want none", got)
	}
	close(release)
	p.waitDelivered(t)
	if got, want := api.screen(alice), []string{"first", "second"}; !slices.Equal(got, want) {
		t.Errorf("chat shows %q; want %q", got, want)
	}
	if got := trA.sendCount() + trB.sendCount(); got != 2 {
		t.Errorf("%d messages sent; want each reply once", got)
	}
}
