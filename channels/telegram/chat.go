package telegram

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/channels/delivery"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/store"
)

// chat is the state of one Telegram chat: its incoming queue (handled in
// order by one goroutine at a time), its outgoing queue and the
// presentation of its running turn (handled by another). All fields are
// guarded by Channel.mu.
type chat struct {
	id    int64
	ref   string // the engine's ChatRef
	key   string // the engine's session key
	group bool
	wake  chan struct{} // pokes the outgoing worker; capacity 1

	pace delivery.Pacer // this chat's message spacing and a 429's block

	inbox     []inMsg
	inRunning bool
	dropping  bool // updates are being dropped (inbox full); logged once per burst

	queue      []*outItem  // replies and terminal messages, in order; never dropped
	turns      []*turnView // the running turn, and ended ones with an edit left
	outRunning bool

	noDrafts bool // Telegram refused a draft here: turns are shown in edit mode (drafts.go)

	menu     string // menuKey of the command menu set for this chat ("" = the bot's default)
	menuBusy bool   // a setMyCommands for it is under way (agentmenu.go)

	// cancels are the Cancel buttons shown under queued answers, oldest
	// first, at most maxCancelButtons (queuecancel.go): removed when their
	// message starts or no longer waits.
	cancels []cancelButton
}

type inMsg struct {
	msg    *models.Message
	edited bool
	cb     *models.CallbackQuery // a button was tapped (msg is the message it is under)
	stop   *stoppedGeneration    // a draft's Stop button was tapped (msg holds only the chat)
	retry  bool                  // msg is a person's earlier message sent again by Retry
	runID  string                // the run id of a Retry (each tap its own); "" derives it from msg
	token  string                // a Retry: the secret of the button's token the run holds
	done   chan error            // if not nil (capacity 1): told once the message was handled (nil) or dropped (ErrClosed)
}

func newChat(id int64) *chat {
	ch := &chat{id: id, ref: strconv.FormatInt(id, 10), key: SessionKey(id), wake: make(chan struct{}, 1)}
	ch.setGroup(id < 0) // group and channel ids are negative
	return ch
}

func (ch *chat) setGroup(g bool) {
	ch.group = g
	ch.pace.Interval = privateInterval
	if g {
		ch.pace.Interval = groupInterval
	}
}

// poke wakes the outgoing worker without blocking.
func (ch *chat) poke() {
	select {
	case ch.wake <- struct{}{}:
	default:
	}
}

// activeTurn returns the running turn, if any.
func (ch *chat) activeTurn() *turnView {
	for _, t := range ch.turns {
		if t.active {
			return t
		}
	}
	return nil
}

// turn returns the view of run id, creating it.
func (ch *chat) turn(runID string) *turnView {
	for _, t := range ch.turns {
		if t.runID == runID {
			return t
		}
	}
	t := &turnView{runID: runID}
	ch.turns = append(ch.turns, t)
	return t
}

// viewPending reports whether run's view (if shown) still has an edit to
// make: its closing edit goes before its terminal messages.
func (ch *chat) viewPending(runID string) bool {
	if runID == "" {
		return false
	}
	for _, t := range ch.turns {
		if t.runID == runID {
			return t.pending()
		}
	}
	return false
}

// idle reports whether the chat holds nothing worth keeping.
func (ch *chat) idle() bool {
	return !ch.inRunning && !ch.outRunning && len(ch.inbox) == 0 && len(ch.queue) == 0 && len(ch.turns) == 0
}

// hasOutWork reports whether the outgoing worker has something to do.
func (ch *chat) hasOutWork() bool { return len(ch.queue) > 0 || len(ch.turns) > 0 }

// itemKind is what an outgoing item is.
type itemKind uint8

const (
	itemReply  itemKind = iota // a direct answer (command, busy, hint, alert): plain text, not in the outbox
	itemFinal                  // a turn's reply (or partial reply): Markdown rendered as HTML, in the outbox
	itemNotice                 // a turn's stop/timeout/error notice: plain text, in the outbox
	// A runner's question (approvals.go): plain text with a button per
	// option. Not in the outbox: after a restart the question is no
	// longer open, so sending it then would ask for nothing.
	itemQuestion
	itemQuestionEdit // edits a question message into its settlement (approvals.go)
	itemDropButtons  // removes the buttons under message msgID (a question the gateway no longer knows)
	itemEditReply    // edits a queued answer (message msgID) into text: its message was cancelled (queuecancel.go)
)

// outItem is one queued outgoing message (split into chunks when sent).
type outItem struct {
	kind     itemKind
	runID    string
	text     string
	outboxID int64      // 0: not (yet) in the outbox
	done     chan error // SendText waits here; capacity 1

	// awaiting: a terminal message the store is writing to the outbox
	// (durable endings). It holds its place in the chat's order and goes
	// once claim fills in its outbox row — or, if the row has not come by
	// deadline (the store cannot write), from memory.
	awaiting bool
	deadline time.Time
	// fromMemory: an awaited ending whose row did not come by deadline.
	fromMemory bool
	// partsSent is how many parts of the text (split when long) reached
	// the chat already: delivery goes on from the next one.
	partsSent int
	// approvalID: the question of an itemQuestion or itemQuestionEdit.
	approvalID string
	// msgID: the message of an itemDropButtons or itemEditReply.
	msgID int
	// retryData: a notice's Retry button (its callback data), once issued.
	retryData string
	// cancelData: a queued answer's Cancel button (its callback data).
	cancelData string
}

// durable reports whether the item is a terminal message (it goes
// through the outbox).
func (it *outItem) durable() bool { return it.kind == itemFinal || it.kind == itemNotice }
func (it *outItem) html() bool    { return it.kind == itemFinal }

func (it *outItem) outboxKind() store.OutboxKind {
	if it.kind == itemFinal {
		return store.OutboxFinal
	}
	return store.OutboxNotice
}

// key identifies a terminal message: a run has at most one of each kind.
func (it *outItem) key() string { return it.runID + "/" + string(it.outboxKind()) }

func (it *outItem) outboxMessage(ch *chat) store.OutboxMessage {
	return store.OutboxMessage{Channel: "telegram", ChatRef: ch.ref, RunID: it.runID, Kind: it.outboxKind(), Text: it.text}
}

// view is a message the channel keeps up to date by editing it: a turn's
// step lines or its "still working" notice. want is the text it should
// show, sent what it shows. A view is sent as a new message only while its
// turn runs and it is not closed; after that it is only edited.
type view struct {
	msgID    int
	want     string
	sent     string
	closed   bool // its subject is over: edit only, never send anew
	gone     bool // given up (the message cannot be sent or edited)
	failures int
	retryAt  time.Time
}

func (v *view) dirty(active bool) bool {
	if v.gone || v.want == "" || v.want == v.sent {
		return false
	}
	if v.msgID == 0 {
		return active && !v.closed
	}
	return true
}

// turnView is how one turn is shown in its chat.
type turnView struct {
	runID     string
	active    bool // between TurnStarted and its Finished/Aborted
	paused    bool // waiting for a person: no typing
	asking    int  // questions of the turn open in the chat: no typing either
	typingDue time.Time

	// How the turn is shown (channels.telegram.streaming, fixed when it
	// starts): draft is its draft in draft mode (drafts.go); quiet:
	// streaming off, nothing but typing. Otherwise (edit mode) its views.
	draft *draftView
	quiet bool

	views      []*view    // every view of the turn, in creation order
	steps      *view      // the step lines (when showSteps), or nil
	lines      []stepLine //
	notice     *view      // the open "still working" notice, or nil
	noticeStep event.Step // the step it is about
}

type stepLine struct {
	seq   uint32
	label string
	done  bool
	dur   time.Duration
}

// maxStepLines bounds the step message; older lines are summarised.
const maxStepLines = 30

func (t *turnView) newView() *view {
	v := &view{}
	t.views = append(t.views, v)
	return v
}

func (t *turnView) stepStarted(s event.Step) {
	t.lines = append(t.lines, stepLine{seq: s.Seq, label: clip(s.Label(), 64)})
	t.refreshSteps()
}

func (t *turnView) stepCompleted(s event.Step, at time.Time) {
	var dur time.Duration
	if !s.StartedAt.IsZero() {
		dur = max(at.Sub(s.StartedAt), 0)
	}
	for i := len(t.lines) - 1; i >= 0; i-- {
		if t.lines[i].seq == s.Seq {
			t.lines[i].done, t.lines[i].dur = true, dur
			t.refreshSteps()
			return
		}
	}
	t.lines = append(t.lines, stepLine{seq: s.Seq, label: clip(s.Label(), 64), done: true, dur: dur})
	t.refreshSteps()
}

func (t *turnView) refreshSteps() {
	switch {
	case t.draft != nil:
		t.refreshDraft()
		return
	case t.quiet:
		return
	}
	if t.steps == nil {
		t.steps = t.newView()
	}
	t.steps.want = t.stepsText()
}

// stepsText renders the step lines: "🔧 shell…" while a step runs, "✅
// shell · 1.2s" when it completed, "⏹️ shell" when the turn ended first.
func (t *turnView) stepsText() string {
	lines := t.lines
	var b strings.Builder
	if n := len(lines) - maxStepLines; n > 0 {
		fmt.Fprintf(&b, "… %d earlier steps\n", n+1)
		lines = lines[n+1:]
	}
	for i, l := range lines {
		if i > 0 {
			b.WriteByte('\n')
		}
		switch {
		case l.done:
			fmt.Fprintf(&b, "✅ %s · %s", l.label, messages.Duration(l.dur))
		case !t.active:
			fmt.Fprintf(&b, "⏹️ %s", l.label)
		default:
			fmt.Fprintf(&b, "🔧 %s…", l.label)
		}
	}
	return b.String()
}

// progress opens or updates the "still working" notice.
func (t *turnView) progress(ev event.Event) {
	switch {
	case t.draft != nil:
		t.noticeStep, t.draft.status = ev.Step, ev.Message
		t.refreshDraft()
		return
	case t.quiet:
		return
	}
	if t.notice != nil && t.noticeStep.Seq != ev.Step.Seq {
		t.closeNotice(true, ev.Time) // a different step: the old one is over
	}
	if t.notice == nil {
		t.notice, t.noticeStep = t.newView(), ev.Step
	}
	t.notice.want = ev.Message
}

// closeNotice turns the open notice into its closing line: "✅ shell
// finished after 1m12s." when its step ended, "⏹️ shell stopped after
// 1m40s." when the turn was stopped first. A notice never sent is simply
// dropped (closed views are not sent anew).
func (t *turnView) closeNotice(finished bool, at time.Time) {
	if t.draft != nil && t.draft.status != "" {
		t.draft.status = "" // the status is live only
		t.refreshDraft()
	}
	if t.notice == nil {
		return
	}
	var dur time.Duration
	if !t.noticeStep.StartedAt.IsZero() {
		dur = max(at.Sub(t.noticeStep.StartedAt), 0)
	}
	label := t.noticeStep.Label()
	if label == "" {
		label = "The step"
	}
	if finished {
		t.notice.want = fmt.Sprintf("✅ %s finished after %s.", label, messages.Duration(dur))
	} else {
		t.notice.want = fmt.Sprintf("⏹️ %s stopped after %s.", label, messages.Duration(dur))
	}
	t.notice.closed = true
	t.notice = nil
}

// end records that the turn ended: typing stops, the notice and the step
// lines get their closing text.
func (t *turnView) end(ev event.Event) {
	t.active, t.paused = false, false
	t.closeNotice(ev.Kind == event.Finished && ev.StopReason == event.ReasonStop, ev.Time)
	if t.steps != nil {
		t.steps.want = t.stepsText()
		t.steps.closed = true
	}
}

// pending reports whether any view still needs a send or an edit.
func (t *turnView) pending() bool {
	for _, v := range t.views {
		if v.dirty(t.active) {
			return true
		}
	}
	return false
}
