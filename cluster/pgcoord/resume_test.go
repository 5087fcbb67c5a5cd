package pgcoord

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/store"
)

// A survivor taking over a dead replica's turn with Options.Resume set
// queues the turn's next attempt — at the head of the queue, with the
// person's text, its sender and the step it was cut off in — in the
// takeover's transaction, and ends the turn with the resuming notice
// (history and outbox) instead of the interrupted one. A turn Resume
// declines gets the interrupted notice.
func TestTakeoverQueuesTheNextAttempt(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	type call struct {
		run, text string
		found     bool
	}
	var calls []call
	resume := func(tr store.Turn, prev store.Resume, found bool, text string) (store.Resume, store.QueuedMessage, string, bool) {
		calls = append(calls, call{tr.RunID, text, found})
		if tr.RunID != "tg" {
			return store.Resume{}, store.QueuedMessage{}, "", false
		}
		next := store.Resume{RunID: store.ResumeRunID(tr.RunID, 2), PrevRunID: tr.RunID, OriginRunID: tr.RunID, SessionKey: tr.SessionKey, Attempt: 2,
			Step: tr.CurrentStep, OriginStartedAt: tr.StartedAt}
		return next, store.QueuedMessage{RunID: next.RunID, SessionKey: tr.SessionKey, Channel: tr.Channel, ChatRef: tr.ChatRef,
			Owner: tr.Sender, Text: text, QueuedAt: tr.StartedAt}, "🔄 resuming " + tr.RunID, true
	}
	a := join(t, url, "a", 30*time.Second)
	b := join(t, url, "b", 30*time.Second, func(o *Options) { o.Resume = resume })
	p := db(t, url)
	if _, err := p.Exec(ctx, `INSERT INTO queued (run_id, session_key, channel, chat_ref, text, queued_at)
		VALUES ('waiting', 'telegram:7', 'telegram', '7', 'behind it', now())`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []Claim{
		{RunID: "tg", SessionKey: "telegram:7", Channel: "telegram", ChatRef: "7", Text: "long job"},
		{RunID: "ws", SessionKey: "ws:main", Channel: "ws", Text: "another"},
	} {
		if err := a.Claim(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	expire(t, p, a)
	if _, err := b.Survey(ctx); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(calls, func(x, y call) int { return strings.Compare(x.run, y.run) })
	if want := []call{{"tg", "long job", false}, {"ws", "another", false}}; !slices.Equal(calls, want) {
		t.Errorf("Resume was asked %+v, want %+v", calls, want)
	}
	next := store.ResumeRunID("tg", 2)
	if got := texts(t, p, `SELECT run_id || '=' || text FROM queued ORDER BY seq`); !slices.Equal(got, []string{next + "=long job", "waiting=behind it"}) {
		t.Errorf("queued %q, want the next attempt first", got)
	}
	if n := count(t, p, `SELECT count(*) FROM resumes WHERE run_id = $1 AND origin_run_id = 'tg' AND attempt = 2`, next); n != 1 {
		t.Errorf("%d resume records of %s, want 1", n, next)
	}
	if got := texts(t, p, `SELECT run_id || ': ' || text FROM messages WHERE role = 'assistant' ORDER BY run_id`); !slices.Equal(got,
		[]string{"tg: 🔄 resuming tg", "ws: ⚠️ interrupted: ws"}) {
		t.Errorf("the notices in the history %q", got)
	}
	if got := texts(t, p, `SELECT text FROM outbox WHERE run_id = 'tg'`); !slices.Equal(got, []string{"🔄 resuming tg"}) {
		t.Errorf("the outbox of tg %q, want the resuming notice", got)
	}
}
