package telegram

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
)

// Approvals: a runner's question (event.ApprovalRequested) is sent to the
// turn's chat as a message with one inline button per option (callback
// data "ap:<approval id>:<option index>"). It is queued like the turn's
// other messages, so it comes after what the turn showed before it and
// goes through the same pacing, 429 and 5xx handling. It is not put in the
// outbox: a question does not outlive its gateway (after a restart it is
// expired), so there is nothing to send again.
//
// A tap is answered with Engine.Resolve for the session of the chat the
// tapped message is in; the tap is always answered (answerCallbackQuery)
// with a short toast. When the question is settled — by the tap, from
// another channel or an operator, by the timeout, or by the turn's end —
// the question message is edited into the settlement
// (messages.ApprovalSettled), which removes its buttons. The edit is queued
// behind the question's send, so it finds the message id the send got.

const (
	approvalPrefix = "ap:"

	textApprovalAllowed   = "Allowed"
	textApprovalDenied    = "Denied"
	textApprovalAlready   = "Already answered: "
	textApprovalClosed    = "This question is no longer open"
	textApprovalNotYours  = "Not your conversation"
	textApprovalNotOwner  = "Only the person who sent that request can answer"
	textApprovalBadOption = "That answer is not one of the options"
	textApprovalFailed    = "Could not record your answer — please try again"
)

// question is a runner's question shown in a chat. Guarded by Channel.mu.
type question struct {
	chatID int64
	runID  string
	asked  event.Approval // as requested (its options)

	msgID   int    // the question message; 0 until its sendMessage succeeded
	sent    bool   // the send was tried (its item is done)
	shown   string // the text the message shows
	buttons bool   // the message still shows the buttons

	settled    string // the settlement's text; "" while open
	final      bool   // settled by the engine (not assumed at the turn's end)
	editQueued bool   // an itemQuestionEdit is queued
}

// approvalData is the callback data of option i of approval id.
func approvalData(id string, i int) string { return approvalPrefix + id + ":" + strconv.Itoa(i) }

// parseApprovalData reads callback data made by approvalData.
func parseApprovalData(data string) (id string, i int, ok bool) {
	rest, ok := strings.CutPrefix(data, approvalPrefix)
	if !ok {
		return "", 0, false
	}
	id, idx, ok := strings.Cut(rest, ":")
	if !ok || !strings.HasPrefix(id, "ap_") || len(id) > 40 {
		return "", 0, false
	}
	i, err := strconv.Atoi(idx)
	if err != nil || i < 0 || i > 99 {
		return "", 0, false
	}
	return id, i, true
}

// keyboard is a question's buttons: Allow and Deny side by side, longer
// lists one option per row.
func keyboard(a *event.Approval) models.ReplyMarkup {
	var rows [][]inlineButton
	for i, o := range a.Options {
		data := approvalData(a.ID, i)
		if len(data) > maxCallbackData {
			return nil // not an id the engine makes
		}
		b := inlineButton{Text: o.Label, CallbackData: data}
		if len(a.Options) <= 2 && len(rows) == 1 {
			rows[0] = append(rows[0], b)
			continue
		}
		rows = append(rows, []inlineButton{b})
	}
	if len(rows) == 0 {
		return nil
	}
	return &inlineKeyboard{InlineKeyboard: rows}
}

// askLocked queues a question of turn t. Called with c.mu held.
func (c *Channel) askLocked(ch *chat, t *turnView, ev event.Event) {
	a := ev.Approval
	if _, ok := c.questions[a.ID]; ok {
		return
	}
	text := ev.Message
	if text == "" {
		text = messages.ApprovalAsked(a)
	}
	c.questions[a.ID] = &question{chatID: ch.id, runID: ev.RunID, asked: *a}
	t.asking++
	c.enqueueLocked(ch, &outItem{kind: itemQuestion, runID: ev.RunID, text: text, approvalID: a.ID})
}

// settleLocked records how a question was settled and queues the edit of
// its message. final: the engine settled it (an answer, the timeout);
// otherwise the turn ended with it open and it is taken as cancelled — an
// engine settlement that comes later still wins. Called with c.mu held.
func (c *Channel) settleLocked(ch *chat, a *event.Approval, final bool) {
	q := c.questions[a.ID]
	if q == nil || q.final || q.chatID != ch.id {
		return
	}
	if q.settled == "" {
		for _, t := range ch.turns {
			if t.runID == q.runID && t.asking > 0 {
				t.asking--
				if t.asking == 0 && t.active {
					t.typingDue = time.Now()
				}
			}
		}
	}
	text := messages.ApprovalSettled(a)
	if text == q.settled {
		q.final = q.final || final
		return
	}
	q.settled, q.final = text, final
	if !q.editQueued {
		q.editQueued = true
		c.enqueueLocked(ch, &outItem{kind: itemQuestionEdit, runID: q.runID, approvalID: a.ID})
	}
}

// endQuestionsLocked settles the open questions of a turn that ended as
// cancelled: the engine publishes nothing for them (the turn's ending
// says why it stopped). Called with c.mu held.
func (c *Channel) endQuestionsLocked(ch *chat, runID string) {
	var open []*question
	for _, q := range c.questions {
		if q.runID == runID && q.chatID == ch.id && q.settled == "" {
			open = append(open, q)
		}
	}
	slices.SortFunc(open, func(a, b *question) int {
		if c := a.asked.CreatedAt.Compare(b.asked.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.asked.ID, b.asked.ID)
	})
	for _, q := range open {
		a := q.asked
		a.Outcome = event.ApprovalCancelled
		c.settleLocked(ch, &a, false)
	}
}

// forgetLocked drops a question whose message needs nothing more. Called
// with c.mu held.
func (c *Channel) forgetLocked(id string) {
	q := c.questions[id]
	if q == nil || q.settled == "" || !q.sent || q.editQueued {
		return
	}
	if q.msgID == 0 || (q.shown == q.settled && !q.buttons) {
		delete(c.questions, id)
	}
}

// sendQuestion sends a question with its buttons — or, settled before its
// turn to be sent came, its settlement without them.
func (c *Channel) sendQuestion(ctx context.Context, ch *chat, it *outItem) {
	c.mu.Lock()
	q := c.questions[it.approvalID]
	if q == nil {
		c.mu.Unlock()
		c.itemDone(it, nil)
		return
	}
	text, markup := it.text, models.ReplyMarkup(nil)
	if q.settled != "" {
		text = q.settled
	} else {
		markup = keyboard(&q.asked)
	}
	c.mu.Unlock()
	if chunks := splitText(strings.ToValidUTF8(text, "\uFFFD"), MaxMessageLen); len(chunks) > 0 {
		text = chunks[0] // a question is short (the engine bounds it); never split its buttons off
	}
	id, err := c.sendChunk(ctx, ch, text, false, markup)
	c.mu.Lock()
	q.sent = true
	if err == nil {
		q.msgID, q.shown, q.buttons = id, text, markup != nil
	}
	c.forgetLocked(it.approvalID)
	c.mu.Unlock()
	c.record(ctx, ch, it, err)
	c.itemDone(it, err)
}

// editQuestion edits a question message into its settlement (without
// buttons). A message never sent is left alone: the turn's reply says
// what came of the question.
func (c *Channel) editQuestion(ctx context.Context, ch *chat, it *outItem) {
	c.mu.Lock()
	q := c.questions[it.approvalID]
	if q == nil {
		c.mu.Unlock()
		c.itemDone(it, nil)
		return
	}
	q.editQueued = false
	want, id := q.settled, q.msgID
	need := id != 0 && want != "" && (want != q.shown || q.buttons)
	c.mu.Unlock()
	var err error
	if need {
		err = chatPolicy.Do(ctx, chatPace{c, ch}, func(ctx context.Context) error {
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			return asDelivery(c.api.edit(cctx, ch.id, id, want))
		}, c.onRetry(ch))
	}
	c.mu.Lock()
	switch {
	case !need:
	case err == nil || notModified(err):
		err = nil
		q.shown, q.buttons = want, false
	case editGone(err):
		q.msgID = 0 // deleted, or too old to edit: nothing more to do
		err = nil
	}
	c.forgetLocked(it.approvalID)
	c.mu.Unlock()
	if err != nil && ctx.Err() == nil {
		c.log.Warn("telegram: could not edit a question into its answer", "chat", ch.id, "run", it.runID, "err", c.red.err(err))
	}
	c.itemDone(it, nil)
}

// dropButtons removes the buttons under a question the gateway no longer
// knows.
func (c *Channel) dropButtons(ctx context.Context, ch *chat, it *outItem) {
	err := chatPolicy.Do(ctx, chatPace{c, ch}, func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		return asDelivery(c.api.dropButtons(cctx, ch.id, it.msgID))
	}, c.onRetry(ch))
	if err != nil && !notModified(err) && !editGone(err) && ctx.Err() == nil {
		c.log.Warn("telegram: could not remove the buttons of an old question", "chat", ch.id, "message", it.msgID, "err", c.red.err(err))
	}
	c.itemDone(it, nil)
}

// presser names who tapped a button as the settlement shows them.
func presser(u models.User) string {
	switch {
	case u.Username != "":
		return "@" + u.Username
	case u.FirstName != "":
		return u.FirstName
	}
	return "user " + strconv.FormatInt(u.ID, 10)
}

// alreadyText is the toast of a tap on a question settled before it.
func alreadyText(a *event.Approval) string {
	switch a.Outcome {
	case event.ApprovalSelected:
		return textApprovalAlready + messages.ApprovalDecision(a)
	case event.ApprovalTimeout:
		return textApprovalAlready + "no answer in time, so it was denied"
	}
	return textApprovalClosed
}

// handleApproval answers a tap on a question's button: the answer goes to
// the engine for the session of the chat the tap came from.
func (c *Channel) handleApproval(ctx context.Context, ch *chat, cb *models.CallbackQuery) {
	id, idx, ok := parseApprovalData(cb.Data)
	if !ok {
		c.answerCallback(ctx, ch, cb, textApprovalClosed)
		return
	}
	c.mu.Lock()
	var opts []event.ApprovalOption
	runID := ""
	known := false
	if q := c.questions[id]; q != nil && q.chatID == ch.id {
		opts, runID, known = q.asked.Options, q.runID, true
	}
	c.mu.Unlock()
	if !known {
		for _, a := range c.eng.PendingApprovals(ch.key) {
			if a.ID == id {
				opts = a.Options
			}
		}
	}
	optionID, number := "", idx+1 // the engine picks by place when this replica does not have the question
	if idx < len(opts) {
		optionID = opts[idx].ID
	}
	m := callbackMessage(cb)
	if group := m != nil && m.Chat.Type != "" && m.Chat.Type != models.ChatTypePrivate; group && runID != "" {
		// As with /stop and Retry: in a group, the request is its
		// sender's.
		c.mu.Lock()
		run, ok := c.recent.get(runID)
		c.mu.Unlock()
		if ok && run.sender != 0 && run.sender != cb.From.ID {
			c.answerCallback(ctx, ch, cb, textApprovalNotOwner)
			return
		}
	}
	res, err := c.eng.Resolve(ctx, gateway.ResolveRequest{ApprovalID: id, OptionID: optionID, OptionNumber: number,
		SessionKey: ch.key, By: presser(cb.From)})
	switch {
	case errors.Is(err, gateway.ErrApprovalForbidden):
		c.answerCallback(ctx, ch, cb, textApprovalNotYours)
	case errors.Is(err, gateway.ErrApprovalNotFound):
		c.answerCallback(ctx, ch, cb, textApprovalClosed)
		if m != nil {
			c.mu.Lock()
			c.enqueueLocked(ch, &outItem{kind: itemDropButtons, msgID: m.ID})
			c.mu.Unlock()
		}
	case errors.Is(err, gateway.ErrApprovalOption):
		c.answerCallback(ctx, ch, cb, textApprovalBadOption)
	case err != nil:
		c.log.Warn("telegram: an answer to a question failed", "chat", ch.id, "approval", id, "err", c.red.err(err))
		c.answerCallback(ctx, ch, cb, textApprovalFailed)
	default:
		c.mu.Lock()
		c.settleLocked(ch, &res.Approval, true) // the edit is queued now; the engine's event finds it done
		c.mu.Unlock()
		switch {
		case res.Already:
			c.answerCallback(ctx, ch, cb, alreadyText(&res.Approval))
		case res.Approval.Allowed():
			c.answerCallback(ctx, ch, cb, textApprovalAllowed)
		default:
			c.answerCallback(ctx, ch, cb, textApprovalDenied)
		}
	}
}
