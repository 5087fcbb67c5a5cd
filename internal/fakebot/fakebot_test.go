package fakebot

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/testwait"
)

func call(t *testing.T, b *Bot, method string, form url.Values) (int, map[string]any) {
	t.Helper()
	res, err := http.PostForm(b.URL()+"/bot"+Token+"/"+method, form)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var v map[string]any
	_ = json.NewDecoder(res.Body).Decode(&v)
	return res.StatusCode, v
}

// TestBot: a queued message is long-polled once and then confirmed away by
// the offset; a second poll while one waits gets 409 as from Telegram; sent
// messages are recorded, refused ones too when told to fail.
func TestBot(t *testing.T) {
	b := New(t)
	if code, _ := call(t, b, "getMe", nil); code != 200 {
		t.Fatalf("getMe: %d", code)
	}
	id := b.Say("/stop now")
	code, v := call(t, b, "getUpdates", url.Values{"offset": {"0"}, "timeout": {"0"}})
	res, _ := v["result"].([]any)
	if code != 200 || len(res) != 1 || !strings.Contains(mustJSON(res[0]), `"bot_command"`) {
		t.Fatalf("getUpdates: %d %v", code, v)
	}
	// Confirmed by the next offset: gone.
	_, v = call(t, b, "getUpdates", url.Values{"offset": {jsonNum(id + 1)}, "timeout": {"0"}})
	if res, _ := v["result"].([]any); len(res) != 0 {
		t.Fatalf("a confirmed update came again: %v", v)
	}

	// A long poll waits; a second one meanwhile is refused with 409.
	polled := make(chan int, 1)
	go func() {
		c, _ := call(t, b, "getUpdates", url.Values{"offset": {jsonNum(id + 1)}, "timeout": {"5"}})
		polled <- c
	}()
	testwait.Until(t, 5*time.Second, "the long poll waits", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.polling == 1
	})
	if code, _ := call(t, b, "getUpdates", url.Values{"timeout": {"0"}}); code != 409 || b.Conflicts() != 1 {
		t.Fatalf("a poll that overlapped another: %d, want 409", code)
	}
	b.Say("wake up")
	if c := <-polled; c != 200 {
		t.Fatalf("the long poll: %d", c)
	}

	if polls := b.Polls(); len(polls) != 2 || polls[0].Via != "" || polls[0].Updates[0] != id {
		t.Fatalf("polls %+v", polls)
	}

	// Through a named base URL: recorded with its name.
	res2, err := http.PostForm(b.URLFor("r2")+"/bot"+Token+"/sendMessage", url.Values{"chat_id": {"4242"}, "text": {"hello"}})
	if err != nil {
		t.Fatal(err)
	}
	res2.Body.Close()
	if m := b.Messages(); len(m) != 1 || m[0].Via != "r2" {
		t.Fatalf("messages %+v, want one via r2", m)
	}
	b.SetFail(true)
	if code, _ := call(t, b, "sendMessage", url.Values{"chat_id": {"4242"}, "text": {"refused"}}); code != 500 {
		t.Fatalf("sendMessage while failing: %d", code)
	}
	if sent := b.Sent(); len(sent) != 1 || sent[0] != "hello" || b.Count("hello") != 1 {
		t.Fatalf("sent %q", sent)
	}
	if got := b.WaitSent(time.Second, "hello", func(s string) bool { return s == "hello" }); got != "hello" {
		t.Fatalf("WaitSent: %q", got)
	}
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

func jsonNum(n int64) string { return mustJSON(n) }
