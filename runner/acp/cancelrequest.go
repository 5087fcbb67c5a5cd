package acp

// abandon gives up on request id of ours: its answer, if it comes, is
// dropped, and the agent is told with ACP's $/cancel_request notification
// ({"requestId": id}), so that it may stop the work. The notification is
// unstable in ACP v1 but harmless: an agent that does not know it ignores
// it, as JSON-RPC and ACP say of unknown notifications (a "$/" method is
// never answered). A failed write is logged by the connection's breakage
// handling, not here.
func (ag *agent) abandon(id int64, method string) {
	ag.c.forget(id)
	if ag.isDead() {
		return
	}
	if err := ag.c.notify("$/cancel_request", map[string]int64{"requestId": id}); err != nil {
		ag.log.Debug("acp: $/cancel_request not sent", "method", method, "err", err)
		return
	}
	ag.log.Debug("acp: request abandoned; $/cancel_request sent", "method", method, "request_id", id)
}
