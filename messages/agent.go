package messages

import "fmt"

// The texts of the agent runner (runner/acp) that a user reads.

// AgentNoReply is the reply of an agent turn that ended normally without
// any text — after the person denied a tool, say, an agent may just stop.
const AgentNoReply = "The agent finished without a reply."

// AgentStartFailed is what a user reads when the agent process refused
// initialize, the very first request: it never started. why is the agent's
// own one-line error message ("Invalid params").
func AgentStartFailed(why string) string {
	return "The agent failed to start (it refused initialize: " + why + "). Tell the operator."
}

// AgentSessionRefused is what a user reads when a started agent refused to
// open a session for the conversation (session/new). why is as above.
func AgentSessionRefused(why string) string {
	return "The agent refused to start a session: " + why
}

// AgentStarting is the reason the liveness clock is paused while the agent
// process starts and opens the conversation's session (bounded by
// agents.acp.startTimeoutSeconds instead).
const AgentStarting = "starting the agent"

// AgentContextLost is what a user reads, at the start of the agent's
// reply, when the conversation had an agent session that the agent could
// not restore — after a gateway restart, an agent crash or a long pause,
// with an agent that cannot load sessions — so the conversation goes on in
// a new one. Said once: the new session is the conversation's from then on.
const AgentContextLost = "ℹ️ The agent no longer has the earlier part of this conversation (it was restarted or paused for long), so it starts afresh: repeat anything it needs to know."

// AgentPlanStep names the turn's step after the entry in progress of the
// agent's plan — its n-th of total entries — wherever the step is named:
// the "⏳ Still working" notice ("⏳ Still working — 📋 2/5: Run tests has
// been running for 2 min…"), the web chat, the trace. StepLabel keeps such
// a name for a model step.
func AgentPlanStep(n, total int, content string) string {
	return fmt.Sprintf("%s%d/%d: %s", planMark, n, total, content)
}

// planMark starts every step name AgentPlanStep makes.
const planMark = "📋 "

// AgentSignInNeeded is what a user reads when the agent needs a sign-in
// (ACP's auth_required) that turnguard could not do: no
// agents.acp.authMethod is configured, or authenticate failed. Signing in
// is the operator's job, never the person's; ref is the reference of the
// WARN line the operator finds in the log.
func AgentSignInNeeded(ref string) string {
	return fmt.Sprintf("The agent is not signed in, so it cannot answer. The operator needs to sign it in; tell them (reference %s).", ref)
}

// AgentSigningIn is the reason the liveness clock is paused while the
// agent signs in (ACP's authenticate, bounded by
// agents.acp.startTimeoutSeconds instead).
const AgentSigningIn = "signing the agent in"

// AgentRestarting: the agent process is being replaced (a configuration
// change, a stuck process) as the message arrives.
const AgentRestarting = "The agent is being restarted. Send your message again."

// AgentCannotStart: the agent process could not be started (the command
// failed, or it exited during start-up).
const AgentCannotStart = "The agent could not be started. Try again later."

// AgentUnreachable: the agent's connection broke before the prompt reached
// it.
const AgentUnreachable = "The agent could not be reached. Send your message again to start it anew."

// AgentCouldNotAnswer: the agent answered the prompt with an error; why is
// its own message, on one line and cut short by the caller.
func AgentCouldNotAnswer(why string) string { return "The agent could not answer: " + why }

// AgentAnswerUnreadable: the agent's answer to the prompt was not valid.
const AgentAnswerUnreadable = "The agent's answer could not be read."

// AgentForeignSession: the agent resumed or loaded a session that is not
// this conversation's, so the message was kept from it.
const AgentForeignSession = "The agent answered with another conversation's session, so your message was not sent to it. Try again later."

// AgentOtherVersion: the agent answered initialize with a protocol version
// the gateway does not speak.
func AgentOtherVersion(agent, ours int) string {
	return fmt.Sprintf("The agent speaks ACP version %d; turnguard speaks version %d.", agent, ours)
}

// AgentStartTimedOut: the agent did not finish starting within
// agents.acp.startTimeoutSeconds (after).
func AgentStartTimedOut(after Duration) string {
	return fmt.Sprintf("The agent did not answer within %s while starting, so it was stopped. Try again later.", after)
}
