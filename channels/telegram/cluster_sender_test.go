package telegram

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
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
			reached, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			trC.setFail(func(req *http.Request) error {
				if strings.HasSuffix(req.URL.Path, "/sendMessage") {
					once.Do(func() { close(reached); <-release })
				}
				return nil
			})
			chC := p.channel(t, doomed, trC)
			select {
			case <-reached:
			case <-time.After(clusterWait):
				t.Fatal("replica c sent nothing")
			}
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
