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

// commandAnswer answers a chat.send whose message was a conversation
// command, carried out by conv.Handle (see docs/protocol.md §6
// "Commands"). A command never starts a turn, never reaches the runner and
// is never refused as busy. /stop answers OpenClaw's {ok, aborted, runIds};
// /status, /new and /help answer {ok, runId, status:"ok"}. Every answer in
// words (an idle /stop, a /stop that dropped queued messages, /status,
// /new, /help) follows the response as a chat "final" event whose runId is
// the request's idempotencyKey, sent to this connection only.
func commandAnswer(c *conn, req request, key, runID string, ans conv.Answer) (any, *rpcError) {
	if errors.Is(ans.Err, gateway.ErrNotOwner) {
		msg := "not allowed to abort this run: another client started it"
		if ans.Command == conv.New {
			msg = ans.Text
		}
		return nil, &rpcError{Code: CodeForbidden, Message: msg}
	}
	if ans.Failed {
		c.s.log.Error("command failed", "conn", c.id, "session", key, "command", ans.Command, "err", ans.Err)
		if ans.Command != conv.New { // /new reset the conversation all the same
			return nil, unavailable(ans.Text)
		}
	}
	var res any = map[string]any{"ok": true, "runId": runID, "status": "ok"}
	if ans.Command == conv.Stop {
		ids := ans.Stopped.RunIDs
		if ids == nil {
			ids = []string{}
		}
		res = map[string]any{"ok": true, "aborted": ans.Stopped.Aborted, "runIds": ids}
	}
	c.push(resFrame(req.ID, res, nil))
	if ans.Text != "" {
		t := time.Now()
		c.push(outFrame{data: encodeChat(&chatEvent{RunID: runID, SessionKey: key, Seq: 1, AgentID: agentOf(key), State: "final",
			StopReason: string(event.ReasonStop), Message: textMessage("assistant", ans.Text, t, ""), EndedAt: ms(t)}),
			seq: true, runID: runID, terminal: true})
	}
	return deferred, nil
}

// maxSuggested bounds commands.list: the gateway's commands, /mode and
// the agent's (whose runner keeps at most 100 per session).
const maxSuggested = 110

// commandsListParams are commands.list's: the session whose commands are
// listed (default the main session).
type commandsListParams struct {
	SessionKey string `json:"sessionKey"`
}

// commandsList answers commands.list with the commands a person can type
// in the session (conv.Menu): the gateway's first, then /mode and the
// agent's own when the ws channel's runner has an agent — in cluster mode
// the agent of the replica that runs the session's turn. The web chat
// suggests them when the person types "/".
func commandsList(c *conn, req request) (any, *rpcError) {
	var p commandsListParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	key, rerr := canonicalKey(req.Method, p.SessionKey)
	if rerr != nil {
		return nil, rerr
	}
	menu := conv.Menu(c.ctx, c.s.eng, conv.Inbound{SessionKey: key, Channel: config.ChannelWS, ChatRef: c.id, Sender: c.owner}, maxSuggested)
	return map[string]any{"commands": menu}, nil
}
