package telegram

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-telegram/bot/models"
)

// flakyStream is the update stream as the poller sees it; it refuses the
// first try of one update, as a stream without quorum would.
type flakyStream struct {
	mu      sync.Mutex
	refuse  int64
	refused bool
	tries   []string
}

func (s *flakyStream) PublishUpdate(_ context.Context, updateID, chatID int64, _ []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if updateID == s.refuse && !s.refused {
		s.refused = true
		s.tries = append(s.tries, fmt.Sprintf("%d refused", updateID))
		return errors.New("no quorum")
	}
	s.tries = append(s.tries, fmt.Sprintf("%d stored (chat %d)", updateID, chatID))
	return nil
}

// TestPollerAdvancesOnlyPastStoredUpdates: the poller asks Telegram for
// the updates after one only once the stream stored it, so an update the
// stream refused is fetched again (and Telegram still has it); an update
// not for the bot is not stored but is confirmed.
func TestPollerAdvancesOnlyPastStoredUpdates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{noRun: true})
		h.api.say(alice, "one")                                                                                                                        // 1001
		h.api.say(bob, "two")                                                                                                                          // 1002: refused at first
		h.api.say(alice, "three")                                                                                                                      // 1003
		h.api.push(models.Update{ChannelPost: &models.Message{ID: 1, Date: 1, Chat: models.Chat{ID: -5, Type: models.ChatTypeChannel}, Text: "news"}}) // 1004
		pub := &flakyStream{refuse: 1002}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.ch.poll(ctx, pub)
		}()
		synctest.Wait()
		h.advance(2 * time.Second) // the poller's wait after the refusal
		h.say(bob, "four")         // 1005, while the poller waits in a long poll
		cancel()
		<-done

		wantTries := []string{"1001 stored (chat 1001)", "1002 refused", "1002 stored (chat 1002)", "1003 stored (chat 1001)", "1005 stored (chat 1002)"}
		if !slices.Equal(pub.tries, wantTries) {
			t.Errorf("the stream got %q; want %q", pub.tries, wantTries)
		}
		h.api.mu.Lock()
		offsets := slices.Clone(h.api.offsets)
		h.api.mu.Unlock()
		// 0: everything unconfirmed; 1002: 1001 is stored, 1002 is not;
		// 1005: 1002–1004 are stored or not for the bot; 1006 after "four".
		if want := []int64{0, 1002, 1005, 1006}; !slices.Equal(offsets, want) {
			t.Errorf("getUpdates offsets %v; want %v", offsets, want)
		}
		if h.ch.Polling() {
			t.Error("Polling() after the poll's context ended")
		}
	})
}
