// The agent process's lifecycle as the runner sees it: starting one for
// new turns and initializing it, retiring it (now, or when its last turn
// ends), releasing a turn's session, and the idle sweep that forgets idle
// sessions and stops an idle agent.

package acp

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"time"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
)

// agentFor returns the agent new turns go to, starting one when there is
// none (or it died, or is retiring), once it has answered initialize;
// waiting is called first when it has not answered yet.
func (r *Runner) agentFor(ctx context.Context, log *slog.Logger, waiting func()) (*agent, error) {
	r.mu.Lock()
	if r.retired {
		r.mu.Unlock()
		return nil, &runner.UserError{Message: messages.AgentRestarting}
	}
	ag := r.cur
	if ag == nil || ag.isDead() || r.retiring[ag] {
		r.started++
		var err error
		ag, err = r.start(r.started)
		if err != nil {
			r.mu.Unlock()
			log.Error("acp: agent not started", "err", err)
			return nil, &runner.UserError{Message: messages.AgentCannotStart}
		}
		r.cur, r.curUsed = ag, time.Now()
		go r.initialize(ag)
	}
	r.mu.Unlock()
	select {
	case <-ag.ready:
	default:
		waiting()
		select {
		case <-ag.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if ag.startErr != nil {
		return nil, ag.startErr
	}
	return ag, nil
}

// initialize sends initialize, bounded by the start-up timeout, and closes
// ag.ready; an agent that fails it is stopped.
func (r *Runner) initialize(ag *agent) {
	defer close(ag.ready)
	var res struct {
		ProtocolVersion int `json:"protocolVersion"`
		AgentInfo       *struct {
			Name  string `json:"name"`
			Title string `json:"title"`
		} `json:"agentInfo"`
		AgentCapabilities json.RawMessage `json:"agentCapabilities"`
		AuthMethods       json.RawMessage `json:"authMethods"`
	}
	params := map[string]any{
		"protocolVersion": ProtocolVersion,
		"clientCapabilities": map[string]any{
			"fs":          map[string]bool{"readTextFile": true, "writeTextFile": true},
			"terminal":    true,
			"elicitation": map[string]any{"form": struct{}{}, "url": struct{}{}},
		},
		"clientInfo": map[string]string{"name": "turnguard", "title": "turnguard", "version": r.version},
	}
	err := ag.call(context.Background(), r.startTimeout, "initialize", params, &res)
	if err == nil && res.ProtocolVersion != ProtocolVersion {
		ag.log.Error("acp: the agent speaks another protocol version", "version", res.ProtocolVersion)
		ag.startErr = &runner.UserError{Message: messages.AgentOtherVersion(res.ProtocolVersion, ProtocolVersion)}
		ag.kill("The agent was stopped.")
		return
	}
	if err != nil {
		ag.log.Error("acp: initialize failed; stopping the agent", "err", err)
		ag.startErr = startFailure("initialize", err)
		ag.kill("The agent was stopped.")
		return
	}
	if i := res.AgentInfo; i != nil {
		if n := strings.TrimSpace(i.Name); n != "" {
			ag.name = cut(n, 100)
		}
	}
	ag.caps = parseCaps(res.AgentCapabilities)
	ag.authIDs = authMethods(res.AuthMethods)
	ag.log.Info("acp: agent initialized", "agent", ag.name, "load_session", ag.caps.load,
		"resume_session", ag.caps.resume, "close_session", ag.caps.close, "auth_methods", ag.authIDs)
}

// retire stops new turns from going to ag and stops it — now if no turn
// runs on it, else when the last one ends.
func (r *Runner) retire(ag *agent, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retireLocked(ag, why)
}

func (r *Runner) retireLocked(ag *agent, why string) {
	if r.running[ag] == 0 {
		delete(r.retiring, ag)
		ag.log.Info("acp: stopping agent", "reason", why)
		ag.kill("The agent was stopped. Send your message again to start it anew.")
		return
	}
	ag.log.Info("acp: agent retiring: stopped when its running turns end", "reason", why, "running", r.running[ag])
	r.retiring[ag] = true
}

// release ends a turn's use of s on ag.
func (r *Runner) release(ag *agent, s *session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	r.tab.release(s, now)
	if r.running[ag]--; r.running[ag] <= 0 {
		delete(r.running, ag)
		if r.retiring[ag] {
			r.retireLocked(ag, "its last turn ended")
		}
	}
	if ag == r.cur {
		r.curUsed = now
	}
	r.sweepLocked(now)
}

// sweep forgets idle sessions and stops an idle agent; it runs on a timer
// set for the next expiry.
func (r *Runner) sweep() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sweepLocked(time.Now())
}

func (r *Runner) sweepLocked(now time.Time) {
	next := r.tab.expire(now)
	if ag := r.cur; ag != nil && !ag.isDead() && r.running[ag] == 0 && r.tab.uses(ag) == 0 {
		if at := r.curUsed.Add(r.idle); !now.Before(at) {
			ag.stop("idle")
			r.cur = nil
		} else if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	if !next.IsZero() {
		r.timer = time.AfterFunc(next.Sub(now), r.sweep)
	}
}
