// The agent_sign_in episode: an ACP agent that needs the operator to sign
// it in (runner/acp's WithSignInAlert), one episode per runner, opened and
// closed by the runner's own signals like the store's health.

package alerts

import (
	"fmt"
	"time"

	"github.com/turnguard/turnguard/messages"
)

// AgentSignIn reports a change of runner's sign-in state: a non-nil
// problem opens an agent_sign_in episode for the runner with one alert
// (what failed and the reference people quote), nil closes it with a
// recovered message. Repeats of the same state are ignored. It never
// blocks.
func (a *Alerter) AgentSignIn(runner string, problem error) {
	now := time.Now()
	a.signInMu.Lock()
	defer a.signInMu.Unlock()
	ep := a.signIn[runner]
	switch {
	case problem != nil && ep == nil:
		if a.signIn == nil {
			a.signIn = map[string]*episode{}
		}
		ep = &episode{open: true, id: episodeID(KindAgentSignIn, now) + "-" + runner, started: now, last: now, count: 1}
		a.signIn[runner] = ep
		a.raise([]Alert{{Source: "turnguard", Kind: KindAgentSignIn, Episode: ep.id, Time: now, Count: 1, EpisodeStart: now,
			Text: fmt.Sprintf("🚨 turnguard: runner %s: %v. Its turns fail until the agent is signed in: "+
				"set agents.acp.authMethod to a method the agent lists, or sign the agent in on its host.", runner, problem)}})
	case problem == nil && ep != nil:
		delete(a.signIn, runner)
		a.raise([]Alert{{Source: "turnguard", Kind: KindRecovered, Episode: ep.id, Time: now, Count: ep.count, EpisodeStart: ep.started,
			Text: fmt.Sprintf("✅ turnguard recovered: runner %s's agent answers again after %s; it is signed in.",
				runner, messages.Duration(now.Sub(ep.started)))}})
	}
}
