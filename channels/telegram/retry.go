package telegram

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/store"
)

// Retry: the notice of a turn that was interrupted (a restart, a
// shutdown), hit a time limit, was superseded or failed carries a one-tap
// "🔁 Retry" inline button. Tapping it in the chat the turn belonged to
// sends that turn's original message again, as a new turn, exactly as if
// the person had typed it again (commands, busy handling and all). The tap
// is always answered (answerCallbackQuery), so the button stops spinning.
//
// The button is a capability, not a guessable id (issue 19): its callback
// data is "rt:" and a secret of 128 random bits, issued for that notice and
// kept (as its hash) with the turn in the store (store.RetryTokens), bound
// to the turn, its chat and the person who sent its message. Only that
// person's tap in that chat is taken, and a token starts at most one run
// (released again only if that run never started). A turn that ended as
// the person wanted gets no token, so no tap can run it again. Buttons of
// the earlier format ("retry:<run id>") are refused as expired.

const (
	retryPrefix = "rt:"    // + the token's secret
	oldPrefix   = "retry:" // the earlier buttons: + a run id; refused
	retryLabel  = "🔁 Retry"
	// retryTokenBytes is the randomness of a Retry token: 128 bits.
	retryTokenBytes = 16
	// maxCallbackData is Telegram's limit on callback_data, in bytes.
	maxCallbackData = 64
	// maxRecentRuns bounds the runs remembered for Retry; older ones are
	// looked up in the store (Options.Runs).
	maxRecentRuns = 1000

	textRetrying      = messages.RetrySending
	textRetryTooOld   = messages.RetryTooOld
	textRetryElsewere = messages.RetryElsewhere
	textRetryRunning  = messages.RetryRunning
	textRetryNotOwner = messages.RetryNotOwner
	textRetryExpired  = messages.RetryExpired
	textRetryUsed     = messages.RetryUsed
)

// A Retry button's data fits Telegram's limit.
var _ [maxCallbackData - len(retryPrefix) - (retryTokenBytes*8+5)/6]struct{}

// Runs looks up a past turn: its recorded state, the message its user
// sent and whether it was resumed (agents.defaults.resume), and keeps the
// Retry buttons' tokens. store.Backend implements it.
type Runs interface {
	Turn(ctx context.Context, runID string) (store.Turn, error)
	UserText(ctx context.Context, runID string) (string, error)
	Resumed(ctx context.Context, runID string) (bool, error)
	store.RetryTokens
}

// senderRef is how a turn's sender is named (the turn's owner in a group,
// store.Turn.Sender, store.RetryToken.Sender).
func senderRef(userID int64) string { return "telegram-user:" + strconv.FormatInt(userID, 10) }

// retryable reports whether a turn that ended for r offers Retry: it did
// not end as the person wanted (a limit, a restart, a shutdown, a newer
// message, a failure) — not a reply and not their own /stop.
func retryable(r event.StopReason) bool {
	switch {
	case r.IsTimeout(), r == event.ReasonInterrupted, r == event.ReasonShutdown, r == event.ReasonError, r == event.ReasonSuperseded:
		return true
	}
	return false
}

// recentRun is what Retry needs of a run the channel saw.
type recentRun struct {
	chatID  int64
	sender  int64            // the Telegram user who sent the message (0: unknown)
	text    string           // the person's message
	reason  event.StopReason // how it ended; "" while running (or queued)
	token   string           // a run a Retry tap started: the secret of the button's token it holds
	started bool
	ended   bool
}

// recentRuns remembers the running and the retryable ones of the last
// maxRecentRuns runs. Guarded by Channel.mu.
type recentRuns struct {
	runs  map[string]*recentRun
	order []string // oldest first

	taps uint64 // Retry taps that started a run, ever: each gets its own run id
}

// add returns runID's entry, creating it (the oldest is forgotten when
// maxRecentRuns are kept).
func (r *recentRuns) add(runID string, chatID int64) *recentRun {
	if r.runs == nil {
		r.runs = map[string]*recentRun{}
	}
	if run, ok := r.runs[runID]; ok {
		return run
	}
	if len(r.order) >= maxRecentRuns {
		delete(r.runs, r.order[0])
		r.order = r.order[1:]
	}
	r.order = append(r.order, runID)
	run := &recentRun{chatID: chatID}
	r.runs[runID] = run
	return run
}

// sent records who sent the message of run runID, before it starts.
func (r *recentRuns) sent(runID string, chatID, sender int64) {
	r.add(runID, chatID).sender = sender
}

// forget drops runID (a Retry that did not start a turn).
func (r *recentRuns) forget(runID string) {
	if run, ok := r.runs[runID]; ok && !run.ended {
		delete(r.runs, runID)
	}
}

// heldToken is a Retry token held by a run that never ran.
type heldToken struct{ secret, runID string }

// dropQueued forgets the runs of chat chatID that never started: a /stop
// or /new dropped the session's queue (no event says so). It returns the
// Retry tokens those runs held, to be released: the button may be tapped
// again.
func (r *recentRuns) dropQueued(chatID int64) []heldToken {
	var held []heldToken
	for id, run := range r.runs {
		if run.chatID == chatID && !run.started {
			if run.token != "" {
				held = append(held, heldToken{run.token, id})
			}
			delete(r.runs, id)
		}
	}
	return held
}

// running reports whether runID is queued or running.
func (r *recentRuns) running(runID string) bool {
	run, ok := r.runs[runID]
	return ok && !run.ended
}

// newRetryID returns a fresh run id for a tap of the Retry button under
// message msgID of chat chatID.
func (r *recentRuns) newRetryID(chatID int64, msgID int) string {
	r.taps++
	// The time keeps it unique across restarts, the count within one.
	return fmt.Sprintf("%s%d-%d-r%s.%s", config.TelegramRunIDPrefix, chatID, msgID,
		strconv.FormatInt(time.Now().UnixNano(), 36), strconv.FormatUint(r.taps, 36))
}

// note records a run's start (its text) and its ending (its reason).
func (r *recentRuns) note(ev event.Event, chatID int64) {
	switch ev.Kind {
	case event.TurnStarted:
		run := r.add(ev.RunID, chatID)
		run.chatID, run.text, run.reason, run.started, run.ended = chatID, ev.Text, "", true, false
	case event.Finished, event.Aborted:
		run, ok := r.runs[ev.RunID]
		switch {
		case !ok:
		case retryable(ev.StopReason):
			run.reason, run.ended = ev.StopReason, true
		default:
			delete(r.runs, ev.RunID) // no Retry to offer: forget its text (its order entry ages out)
		}
	}
}

func (r *recentRuns) get(runID string) (recentRun, bool) {
	if run, ok := r.runs[runID]; ok {
		return *run, true
	}
	return recentRun{}, false
}

// retryMarkup is the Retry button for a notice item of a retryable turn,
// or nil. The button's token is issued on the first call and kept with the
// item, so a notice sent again carries the same one. A turn whose sender
// is not known (a group turn recorded before senders were kept) gets no
// button: nobody could be allowed to press it.
func (c *Channel) retryMarkup(ctx context.Context, ch *chat, it *outItem) models.ReplyMarkup {
	if it.kind != itemNotice || it.runID == "" {
		return nil
	}
	if it.retryData == "" {
		it.retryData = c.issueRetry(ctx, ch, it.runID)
	}
	if it.retryData == "" {
		return nil
	}
	return &inlineKeyboard{InlineKeyboard: [][]inlineButton{{
		{Text: retryLabel, CallbackData: it.retryData},
	}}}
}

// issueRetry returns the callback data of a new Retry button for run runID
// of ch, its token saved; "" if the turn offers no Retry (it ended as the
// person wanted, is unknown, or its sender is), or the token could not be
// saved.
func (c *Channel) issueRetry(ctx context.Context, ch *chat, runID string) string {
	c.mu.Lock()
	run, ok := c.recent.get(runID)
	c.mu.Unlock()
	reason, sender := run.reason, ""
	if run.sender != 0 {
		sender = senderRef(run.sender)
	}
	if !ok && c.runs != nil {
		t, err := c.runs.Turn(ctx, runID)
		if err != nil {
			if !errors.Is(err, store.ErrNotFound) {
				c.log.Warn("telegram: cannot look up a turn for its Retry button", "chat", ch.id, "run", runID, "err", c.red.err(err))
			}
			return ""
		}
		if t.Channel != config.ChannelTelegram || t.ChatRef != ch.ref {
			return ""
		}
		reason, sender = t.StopReason, t.Sender
	}
	if sender == "" && !ch.group {
		sender = senderRef(ch.id) // a private chat's id is its person's
	}
	if !retryable(reason) || sender == "" || c.resumed(ctx, runID) {
		return ""
	}
	var b [retryTokenBytes]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	secret := base64.RawURLEncoding.EncodeToString(b[:])
	tok := store.RetryToken{RunID: runID, Channel: config.ChannelTelegram, ChatRef: ch.ref, Sender: sender, CreatedAt: time.Now()}
	if err := c.tokens.SaveRetryToken(ctx, secret, tok); err != nil {
		c.log.Warn("telegram: cannot keep a Retry button's token; sending the notice without it", "chat", ch.id, "run", runID, "err", c.red.err(err))
		return ""
	}
	return retryPrefix + secret
}

// resumed reports whether an attempt replaces run runID (its notice says
// "resuming it"): a Retry would run the request a second time. A failed
// lookup offers the Retry, as before resume.
func (c *Channel) resumed(ctx context.Context, runID string) bool {
	if c.runs == nil {
		return false
	}
	yes, err := c.runs.Resumed(ctx, runID)
	if err != nil {
		c.log.Warn("telegram: cannot tell whether a turn was resumed", "run", runID, "err", c.red.err(err))
	}
	return yes
}

// callbackMessage is the message a tapped button is under, or nil for a
// button not under a chat message (inline mode). Telegram sends only the
// chat and the id of a message too old for it to show in full.
func callbackMessage(cb *models.CallbackQuery) *models.Message {
	switch m := cb.Message; {
	case m.Message != nil:
		return m.Message
	case m.InaccessibleMessage != nil:
		return &models.Message{ID: m.InaccessibleMessage.MessageID, Chat: m.InaccessibleMessage.Chat}
	}
	return nil
}

// handleRetry answers a tapped button and, for a Retry token of this chat
// tapped by the person it was issued to and not used yet, sends the turn's
// original message again. Anything else is refused in words and starts
// nothing: an unknown (forged, pruned) or old-format button, another
// chat's, another person's, one already used.
func (c *Channel) handleRetry(ctx context.Context, ch *chat, cb *models.CallbackQuery) {
	secret, ok := strings.CutPrefix(cb.Data, retryPrefix)
	m := callbackMessage(cb)
	if (!ok && !strings.HasPrefix(cb.Data, oldPrefix)) || m == nil {
		c.answerCallback(ctx, ch, cb, "") // not a button of ours
		return
	}
	tok, answer := c.retryToken(ctx, ch, cb, secret)
	if answer != "" {
		c.answerCallback(ctx, ch, cb, answer)
		return
	}
	// Each tap is a turn of its own (its own run id, so its ending is
	// recorded and delivered even after the first one's).
	c.mu.Lock()
	newID := c.recent.newRetryID(ch.id, m.ID)
	c.mu.Unlock()
	held, err := c.tokens.UseRetryToken(ctx, secret, newID, time.Now())
	if errors.Is(err, store.ErrTokenUsed) {
		c.mu.Lock()
		running := c.recent.running(held.UsedBy)
		c.mu.Unlock()
		if running {
			c.answerCallback(ctx, ch, cb, textRetryRunning)
		} else {
			c.answerCallback(ctx, ch, cb, textRetryUsed)
		}
		return
	}
	if err != nil {
		c.log.Warn("telegram: cannot use a Retry button's token", "chat", ch.id, "run", tok.RunID, "err", c.red.err(err))
		c.answerCallback(ctx, ch, cb, textRetryTooOld)
		return
	}
	text := c.retryText(ctx, ch, tok.RunID)
	if text == "" {
		c.releaseRetry(ch, heldToken{secret, newID})
		c.answerCallback(ctx, ch, cb, textRetryTooOld)
		return
	}
	c.mu.Lock()
	c.recent.add(newID, ch.id).token = secret // released if its message is dropped before it runs
	c.mu.Unlock()
	c.answerCallback(ctx, ch, cb, textRetrying)
	from := cb.From // the token's sender, checked
	c.handle(ctx, ch, inMsg{retry: true, runID: newID, token: secret, msg: &models.Message{ID: m.ID, Chat: m.Chat, From: &from, Date: m.Date, Text: text}})
}

// retryToken looks up the token of a tapped Retry button and checks it
// may be pressed here, by this person: answer is the refusal, "" if it
// may.
func (c *Channel) retryToken(ctx context.Context, ch *chat, cb *models.CallbackQuery, secret string) (tok store.RetryToken, answer string) {
	if secret == "" {
		return tok, textRetryExpired // an old-format button, or no token
	}
	tok, err := c.tokens.RetryToken(ctx, secret)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return tok, textRetryExpired
	case err != nil:
		c.log.Warn("telegram: cannot look up a Retry button's token", "chat", ch.id, "err", c.red.err(err))
		return tok, textRetryTooOld
	case tok.Channel != config.ChannelTelegram || tok.ChatRef != ch.ref:
		return tok, textRetryElsewere
	case tok.Sender != senderRef(cb.From.ID):
		// Telegram has no operators: only the sender's own tap runs it
		// again, as theirs (they can stop it).
		return tok, textRetryNotOwner
	}
	return tok, ""
}

// releaseRetry makes a token a run held usable again: that run never ran.
func (c *Channel) releaseRetry(ch *chat, h heldToken) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.baseCtx), callTimeout)
	defer cancel()
	if err := c.tokens.ReleaseRetryToken(ctx, h.secret, h.runID); err != nil {
		c.log.Warn("telegram: cannot release a Retry button's token", "chat", ch.id, "run", h.runID, "err", c.red.err(err))
	}
}

// retryText finds run's original message: in memory, else in the store;
// "" if neither has it.
func (c *Channel) retryText(ctx context.Context, ch *chat, runID string) string {
	c.mu.Lock()
	run, ok := c.recent.get(runID)
	c.mu.Unlock()
	switch {
	case ok && strings.TrimSpace(run.text) != "":
		return run.text
	case c.runs == nil:
		return ""
	}
	text, err := c.runs.UserText(ctx, runID)
	if err != nil || strings.TrimSpace(text) == "" {
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			c.log.Warn("telegram: cannot look up a message to retry", "chat", ch.id, "run", runID, "err", c.red.err(err))
		}
		return ""
	}
	return text
}

// answerCallback answers a tapped button (the button stops spinning; text,
// if any, shows briefly).
func (c *Channel) answerCallback(ctx context.Context, ch *chat, cb *models.CallbackQuery, text string) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := c.api.answerCallback(cctx, cb.ID, text); err != nil {
		c.log.Warn("telegram: answering a button tap failed", "chat", ch.id, "err", c.red.err(err))
	}
}
