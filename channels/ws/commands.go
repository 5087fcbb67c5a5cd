package ws

import (
	"errors"
	"time"

	"github.com/turnguard/turnguard/channels/conv"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
)

// helpProgress is what the help says a WebSocket client sees while a turn
// works.
const helpProgress = "While it works you see each step it takes; /stop (or the Stop button) ends it."

// command carries out a chat.send whose message is a conversation command
// (see package conv and docs/protocol.md §6 "Commands"). It never starts a
// turn, never reaches the runner and is never refused as busy. /stop
// answers OpenClaw's {ok, aborted, runIds}; /status, /new and /help answer
// {ok, runId, status:"ok"}. Every answer in words (an idle /stop, /status,
// /new, /help) follows the response as a chat "final" event whose runId is
// the request's idempotencyKey, sent to this connection only.
func command(c *conn, req request, key, runID string, cmd conv.Command) (any, *rpcError) {
	c.s.watch(c, key) // the aborted event of a stopped run goes out before the response
	var res any
	var text string
	switch cmd {
	case conv.Stop:
		r, err := conv.DoStop(c.ctx, c.s.eng, key, c.owner, c.operator)
		switch {
		case errors.Is(err, gateway.ErrNotOwner):
			return nil, &rpcError{Code: CodeForbidden, Message: "not allowed to abort this run: another client started it"}
		case err != nil:
			c.s.log.Error("/stop failed", "conn", c.id, "session", key, "err", err)
			return nil, unavailable(r.Text)
		}
		ids := r.RunIDs
		if ids == nil {
			ids = []string{}
		}
		res, text = map[string]any{"ok": true, "aborted": r.Aborted, "runIds": ids}, r.Text
	case conv.Status:
		text = conv.StatusText(c.s.eng.Active(key))
	case conv.New:
		t, err := conv.DoNew(c.ctx, c.s.eng, key, c.owner, c.operator)
		if errors.Is(err, gateway.ErrNotOwner) {
			return nil, &rpcError{Code: CodeForbidden, Message: t}
		}
		text = t
	case conv.Help:
		text = conv.HelpText(c.s.cfg.Current(), config.ChannelWS, helpProgress)
	}
	if res == nil {
		res = map[string]any{"ok": true, "runId": runID, "status": "ok"}
	}
	c.push(resFrame(req.ID, res, nil))
	if text != "" {
		t := time.Now()
		c.push(outFrame{data: encodeChat(&chatEvent{RunID: runID, SessionKey: key, Seq: 1, AgentID: agentOf(key), State: "final",
			StopReason: string(event.ReasonStop), Message: textMessage("assistant", text, t, ""), EndedAt: ms(t)}),
			seq: true, runID: runID, terminal: true})
	}
	return deferred, nil
}
