package acp

import (
	"sync"

	"github.com/turnguard/turnguard/runner"
)

// maxGrants bounds the "always" answers one conversation keeps; past it, a
// new "always" answer counts once (the person is asked again next time).
const maxGrants = 64

// grants are one conversation's "always" answers to the agent's permission
// requests. One agent process serves every conversation, and an agent
// keeps an "always" grant per process (OpenCode does): passed on, chat A's
// "Always allow" would approve the same tool in chat B. So the agent never
// gets an "always" option: the person's "always" reaches it as the
// request's "once" option of the same sense (allow or reject), and the
// gateway remembers it here, for this conversation only — its later
// requests for the same tool call (same tool kind and title) are answered
// with that "once" option without asking. The grants go with the
// conversation's ACP session: /new, idleSeconds or a new agent process
// forget them. Safe for concurrent use.
type grants struct {
	mu sync.Mutex
	m  map[grantKey]runner.OptionKind // AllowAlways or RejectAlways
}

type grantKey struct{ tool, title string }

func keyOf(q runner.Question) grantKey { return grantKey{q.Tool, q.Title} }

// recall returns the option that answers q by an earlier "always" answer
// of the conversation: q's first "once" option of the remembered sense.
// false when there is none (then the person is asked).
func (g *grants) recall(q runner.Question) (optionID string, ok bool) {
	g.mu.Lock()
	kind, ok := g.m[keyOf(q)]
	g.mu.Unlock()
	if !ok {
		return "", false
	}
	return onceOption(q.Options, kind)
}

// settle remembers the person's answer optionID to q when it is an
// "always" one, and returns the option the agent gets: the "once"
// option of the same sense for an "always" answer, else optionID.
func (g *grants) settle(q runner.Question, optionID string) string {
	var kind runner.OptionKind
	for _, o := range q.Options {
		if o.ID == optionID {
			kind = o.Kind
			break
		}
	}
	once, ok := onceOption(q.Options, kind)
	if !ok {
		return optionID
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = map[grantKey]runner.OptionKind{}
	}
	if _, had := g.m[keyOf(q)]; had || len(g.m) < maxGrants {
		g.m[keyOf(q)] = kind
	}
	return once
}

// onceOption returns the first "once" option of opts with the sense of
// the "always" kind (allow_once for allow_always, reject_once for
// reject_always); false for any other kind or when opts has none.
func onceOption(opts []runner.Option, always runner.OptionKind) (string, bool) {
	var once runner.OptionKind
	switch always {
	case runner.AllowAlways:
		once = runner.AllowOnce
	case runner.RejectAlways:
		once = runner.RejectOnce
	default:
		return "", false
	}
	for _, o := range opts {
		if o.Kind == once {
			return o.ID, true
		}
	}
	return "", false
}

// scopedOptions is what the person is offered of an agent's options: an
// "always" option only when a "once" option of the same sense stands in
// for it towards the agent (see grants); one without is dropped, since
// the agent would keep it for every conversation.
func scopedOptions(opts []runner.Option) []runner.Option {
	out := make([]runner.Option, 0, len(opts))
	for _, o := range opts {
		if o.Kind == runner.AllowAlways || o.Kind == runner.RejectAlways {
			if _, ok := onceOption(opts, o.Kind); !ok {
				continue
			}
		}
		out = append(out, o)
	}
	return out
}
