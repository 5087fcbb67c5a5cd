package exec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/turnguard/turnguard/runner"
)

// Permission requests (agents.exec.permissions, jsonl only). The agent
// writes
//
//	{"type":"permission","id":"p1","title":"Run rm -rf build/","detail":"…","tool":"Bash",
//	 "options":[{"id":"yes","label":"Allow","kind":"allow_once"}, …]}
//
// to stdout; the runner asks the person (runner.Turn.Ask) without holding
// up the rest of the agent's output, and writes the answer to the agent's
// stdin as one line:
//
//	{"type":"permission_response","id":"p1","outcome":"selected","optionId":"yes","allowed":true}
//
// outcome is "selected" (the person chose optionId; allowed follows the
// option's kind), "timeout" (nobody answered in time: denied) or "refused"
// (the request was not asked: it was malformed, too many were open or
// nobody can be asked; reason says why; denied). Every request that reaches
// the runner while the turn runs gets exactly one response, with one
// exception: an agent that does not read its answers (maxQueuedAnswers of
// them wait to be written) gets no refusals beyond them — those are dropped
// and counted, never queued without bound. A request still open when the
// turn ends (abort, final answer, the agent's exit) gets none. Questions are independent:
// several may be open at once, each answered as the person answers it.

// Bounds of a permission request.
const (
	maxOpenQuestions = 16   // open at once per turn; more are refused
	maxOptions       = 10   // options of one request
	maxOptionID      = 128  // bytes of an option id (it is echoed, so never cut)
	maxTitle         = 300  // bytes of the title shown; longer is cut
	maxDetail        = 4000 // bytes of the detail shown; longer is cut
	maxLabel         = 64   // bytes of an option label; longer is cut
	maxToolName      = 64   // bytes of the tool name; longer is cut
	maxRequestID     = 256  // bytes of the request id as JSON
	maxQueuedAnswers = 64   // answers waiting to be written to stdin; past it refusals are dropped
	// maxLoggedPermissions bounds a turn's log records about permission
	// requests (asked, answered, refused …); the rest are counted in one
	// summary record when the turn ends.
	maxLoggedPermissions = 50
)

// Outcome of a request turnguard did not ask (the answer's "outcome").
const outcomeRefused = "refused"

type permissionOption struct {
	ID    string `json:"id"`
	Label string `json:"label"`
	Kind  string `json:"kind"`
}

type permissionLine struct {
	Title   string             `json:"title"`
	Detail  string             `json:"detail"`
	Tool    string             `json:"tool"`
	Options []permissionOption `json:"options"`
}

type permissionResponse struct {
	Type     string          `json:"type"`
	ID       json.RawMessage `json:"id"`
	Outcome  string          `json:"outcome"`
	OptionID string          `json:"optionId,omitempty"`
	Allowed  bool            `json:"allowed"`
	Reason   string          `json:"reason,omitempty"`
}

// defaultLabels name options that come without a label.
var defaultLabels = map[runner.OptionKind]string{
	runner.AllowOnce:    "Allow once",
	runner.AllowAlways:  "Always allow",
	runner.RejectOnce:   "Deny",
	runner.RejectAlways: "Always deny",
}

// requestID returns the request's id as raw JSON when it is a string or a
// number (echoed as it came), or nil.
func requestID(b []byte) json.RawMessage {
	var head struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(b, &head) != nil || len(head.ID) == 0 || len(head.ID) > maxRequestID {
		return nil
	}
	switch head.ID[0] {
	case '"':
		var s string
		if json.Unmarshal(head.ID, &s) != nil || s == "" {
			return nil
		}
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
	default:
		return nil
	}
	return head.ID
}

// parsePermission reads a permission line into a question. The id is
// returned whenever there is a usable one, also with an error, so that the
// refusal reaches the agent.
func parsePermission(b []byte) (json.RawMessage, runner.Question, error) {
	id := requestID(b)
	if id == nil {
		return nil, runner.Question{}, errors.New(`"id" must be a non-empty string or a number`)
	}
	var p permissionLine
	if err := json.Unmarshal(b, &p); err != nil {
		return id, runner.Question{}, fmt.Errorf("not a permission request: %v", err)
	}
	if len(bytes.TrimSpace([]byte(p.Title))) == 0 {
		return id, runner.Question{}, errors.New(`"title" is required`)
	}
	if len(p.Options) > maxOptions {
		return id, runner.Question{}, fmt.Errorf("%d options, at most %d", len(p.Options), maxOptions)
	}
	q := runner.Question{Title: cut(p.Title, maxTitle), Detail: cut(p.Detail, maxDetail), Tool: cut(p.Tool, maxToolName)}
	seen := map[string]bool{}
	for i, o := range p.Options {
		kind := runner.OptionKind(o.Kind)
		if _, ok := defaultLabels[kind]; !ok {
			return id, runner.Question{}, fmt.Errorf("options[%d].kind %q is not allow_once, allow_always, reject_once or reject_always", i, o.Kind)
		}
		switch {
		case o.ID == "":
			return id, runner.Question{}, fmt.Errorf("options[%d].id is required", i)
		case len(o.ID) > maxOptionID:
			return id, runner.Question{}, fmt.Errorf("options[%d].id is longer than %d bytes", i, maxOptionID)
		case seen[o.ID]:
			return id, runner.Question{}, fmt.Errorf("options[%d].id %q is not unique", i, o.ID)
		}
		seen[o.ID] = true
		label := o.Label
		if label == "" {
			label = defaultLabels[kind]
		}
		q.Options = append(q.Options, runner.Option{ID: o.ID, Label: cut(label, maxLabel), Kind: kind})
	}
	if len(q.Options) == 0 {
		q.Options = append([]runner.Option(nil), runner.DefaultOptions...)
	}
	return id, q, nil
}

// asker asks one turn's permission questions and writes the answers to
// the agent's stdin.
//
// Its cost is bounded whatever the agent writes: at most maxOpenQuestions
// questions are open (one goroutine each), one goroutine writes every
// answer, and at most maxQueuedAnswers answers wait for it. A refusal costs
// no goroutine: when maxQueuedAnswers answers are already waiting (the
// agent does not read its stdin), the refusal is dropped and counted
// (unanswered), so the agent's stdout is still read. Log records are
// bounded too: the first maxLoggedPermissions of a turn are written, and
// summarise logs one record with the counts.
type asker struct {
	ctx     context.Context // done when the turn is stopped, the agent answered or exited
	turn    runner.Turn
	log     *slog.Logger
	w       io.Writer       // the agent's stdin; written by write only
	ready   <-chan struct{} // closed once the message line was written to stdin
	answers chan []byte     // answer lines waiting for write

	mu   sync.Mutex // guards open
	open map[string]bool
	wg   sync.WaitGroup

	records    atomic.Int64 // log records asked for (written while ≤ maxLoggedPermissions)
	refused    atomic.Int64 // requests refused without asking anyone
	unanswered atomic.Int64 // refusals dropped: maxQueuedAnswers answers were waiting
}

func newAsker(ctx context.Context, turn runner.Turn, log *slog.Logger, w io.Writer, ready <-chan struct{}) *asker {
	a := &asker{ctx: ctx, turn: turn, log: log, w: w, ready: ready,
		answers: make(chan []byte, maxQueuedAnswers), open: map[string]bool{}}
	a.wg.Go(a.write)
	if turn.Inbox != nil {
		a.wg.Go(func() { a.relayNotes(turn.Inbox) })
	}
	return a
}

// relayNotes writes the gateway's notes to the runner (a budget warning:
// "N left, wrap up") to the agent's stdin, with the answers, as
//
//	{"type":"note","text":"Note from the gateway: 2 min left before this turn is stopped. …"}
//
// until the turn ends (a note queued then is not written).
func (a *asker) relayNotes(in *runner.Inbox) {
	for {
		select {
		case <-in.Noted():
			for _, n := range in.TakeNotes() {
				line, _ := json.Marshal(struct {
					Type string `json:"type"`
					Text string `json:"text"`
				}{"note", n})
				select {
				case a.answers <- append(line, '\n'):
				case <-a.ctx.Done():
					return
				}
			}
		case <-a.ctx.Done():
			return
		}
	}
}

// logf writes one log record about a permission request while the turn's
// budget (maxLoggedPermissions) lasts; summarise counts the rest.
func (a *asker) logf(level slog.Level, msg string, args ...any) {
	if a.records.Add(1) <= maxLoggedPermissions {
		a.log.Log(context.Background(), level, msg, args...)
	}
}

// ask asks q in the background and answers request id on stdin.
func (a *asker) ask(id json.RawMessage, q runner.Question) {
	if a.ctx.Err() != nil { // the agent has exited or answered: too late to ask
		a.logf(slog.LevelInfo, "exec: permission request after the turn ended ignored", "id", string(id))
		return
	}
	a.mu.Lock()
	switch {
	case a.open[string(id)]:
		a.mu.Unlock()
		a.refuse(id, "a request with this id is still open")
		return
	case len(a.open) >= maxOpenQuestions:
		a.mu.Unlock()
		a.refuse(id, fmt.Sprintf("more than %d requests open at once", maxOpenQuestions))
		return
	}
	a.open[string(id)] = true
	a.mu.Unlock()
	a.logf(slog.LevelInfo, "exec: agent asks for permission", "id", string(id), "title", q.Title, "tool", q.Tool)
	a.wg.Go(func() {
		defer func() {
			a.mu.Lock()
			delete(a.open, string(id))
			a.mu.Unlock()
		}()
		ans, err := a.turn.Ask(a.ctx, q)
		switch {
		case a.ctx.Err() != nil: // the turn ended or was stopped: nothing to answer
			a.logf(slog.LevelInfo, "exec: permission request withdrawn: the turn ended", "id", string(id))
			return
		case err != nil:
			a.refused.Add(1)
			a.logf(slog.LevelWarn, "exec: permission request could not be asked; denied", "id", string(id), "err", err)
			a.respond(permissionResponse{ID: id, Outcome: outcomeRefused, Reason: "nobody can be asked"})
			return
		}
		a.logf(slog.LevelInfo, "exec: permission answered", "id", string(id), "outcome", ans.Outcome,
			"option", ans.OptionID, "allowed", ans.Allowed(), "by", ans.By)
		a.respond(permissionResponse{ID: id, Outcome: string(ans.Outcome), OptionID: ans.OptionID, Allowed: ans.Allowed()})
	})
}

// refuse denies request id without asking anyone. It never blocks and
// starts no goroutine: with maxQueuedAnswers answers already waiting the
// refusal is dropped (counted in unanswered).
func (a *asker) refuse(id json.RawMessage, reason string) {
	a.refused.Add(1)
	a.logf(slog.LevelWarn, "exec: permission request refused", "id", string(id), "reason", reason)
	select {
	case a.answers <- answerLine(permissionResponse{ID: id, Outcome: outcomeRefused, Reason: reason}):
	default:
		a.unanswered.Add(1)
	}
}

// respond queues the answer to a question that was asked, waiting for room
// (there are at most maxOpenQuestions of them) until the turn ends.
func (a *asker) respond(r permissionResponse) {
	select {
	case a.answers <- answerLine(r):
	case <-a.ctx.Done():
	}
}

// answerLine is r as one line for the agent's stdin.
func answerLine(r permissionResponse) []byte {
	r.Type = "permission_response"
	if r.ID == nil {
		r.ID = json.RawMessage("null")
	}
	line, _ := json.Marshal(r)
	return append(line, '\n')
}

// write writes the queued answers to stdin, after the message line, until
// the turn ends (answers still queued then are not written).
func (a *asker) write() {
	select {
	case <-a.ready:
	case <-a.ctx.Done():
		return
	}
	for {
		select {
		case line := <-a.answers:
			if _, err := a.w.Write(line); err != nil {
				a.logf(slog.LevelDebug, "exec: permission answer not delivered", "err", err)
			}
		case <-a.ctx.Done():
			return
		}
	}
}

// wait waits for the questions in flight and the writer; a.ctx must be
// done and stdin closed (a write blocked on a full pipe returns then).
func (a *asker) wait() { a.wg.Wait() }

// summarise logs one record with the turn's refusals and the permission
// records the budget left out, and returns how many were refused.
func (a *asker) summarise() int64 {
	n := a.refused.Load()
	if n > 0 {
		a.log.Warn("exec: permission requests refused", "count", n, "unanswered", a.unanswered.Load())
	}
	if over := a.records.Load() - maxLoggedPermissions; over > 0 {
		a.log.Warn("exec: permission log records not logged (per-turn limit)", "count", over, "logged", maxLoggedPermissions)
	}
	return n
}
