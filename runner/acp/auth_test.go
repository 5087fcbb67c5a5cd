package acp_test

import (
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner/acp"
)

// TestSignIn: the Node agent lists auth methods and answers session/new
// and session/prompt with auth_required until it is signed in. With
// agents.acp.authMethod naming a method that works, the runner calls
// authenticate and sends the request again (session/new on the first turn,
// session/prompt after the agent forgot the sign-in); otherwise the person
// reads that the operator must sign the agent in, with a reference the
// log's WARN line carries too. Every message is valid ACP v1.
func TestSignIn(t *testing.T) {
	node, args := nodeAgent(t)
	valid := acpSchema(t)
	ref := regexp.MustCompile(`\(reference (auth-[0-9a-f]{8})\)\.$`)
	tests := []struct {
		method string
		why    string // in the WARN line when the sign-in fails; "" when it works
	}{
		{method: "test-login"},
		{method: "", why: "agents.acp.authMethod is not set"},
		{method: "broken-login", why: "login server unreachable"},
		{method: "elsewhere", why: "the agent does not list agents.acp.authMethod"},
	}
	for _, tc := range tests {
		t.Run("method="+tc.method, func(t *testing.T) {
			var alertMu sync.Mutex
			var alerts []error
			alerted := func() []error {
				alertMu.Lock()
				defer alertMu.Unlock()
				return slices.Clone(alerts)
			}
			logs, r, _, wire := recorded(t, node, args, func(c *config.ACP) {
				c.Env["ACP_TEST_AUTH"] = "1"
				c.AuthMethod = tc.method
			}, acp.WithSignInAlert(func(problem error) {
				alertMu.Lock()
				defer alertMu.Unlock()
				alerts = append(alerts, problem)
			}))
			c := &conv{key: "k", id: "c"}
			if tc.why == "" {
				for _, step := range []struct{ msg, reply string }{
					{"whoami", "signed in 1 times"}, // session/new needed the sign-in
					{"logout", "logged out"},
					{"whoami", "signed in 2 times"}, // the prompt needed it
				} {
					if got := mustSay(t, r, c.turn(step.msg)); got != step.reply {
						t.Errorf("%s: %q, want %q", step.msg, got, step.reply)
					}
				}
				if seen := checkWire(t, valid, wire); seen["authenticate"] != 2 {
					t.Errorf("sent %v, want 2 authenticate", seen)
				}
				// Signed in each time: the operator is told only that it works.
				if got := alerted(); len(got) != 1 || got[0] != nil {
					t.Errorf("sign-in alerts %v, want one nil (signed in)", got)
				}
				return
			}
			_, err := say(t, r, c.turn("whoami"))
			msg := userError(t, err)
			m := ref.FindStringSubmatch(msg)
			if m == nil || !strings.HasPrefix(msg, "The agent is not signed in, so it cannot answer. The operator needs to sign it in") {
				t.Fatalf("the user reads %q", msg)
			}
			var warn string
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, "acp: the agent needs the operator to sign in") {
					warn = line
				}
			}
			if !strings.Contains(warn, "level=WARN") || !strings.Contains(warn, "error_id="+m[1]) || !strings.Contains(warn, tc.why) ||
				!strings.Contains(warn, "test-login") {
				t.Errorf("the operator's log line %q lacks the reference %s, the methods or %q", warn, m[1], tc.why)
			}
			checkWire(t, valid, wire)
			// The operator's alert: once, however many turns fail, with
			// the reason and the reference the person quotes.
			if _, err := say(t, r, c.turn("whoami")); err == nil {
				t.Error("the second turn worked without a sign-in")
			}
			got := alerted()
			if len(got) != 1 || got[0] == nil || !strings.Contains(got[0].Error(), tc.why) || !strings.Contains(got[0].Error(), m[1]) {
				t.Errorf("sign-in alerts %v, want one naming %q and %s", got, tc.why, m[1])
			}
		})
	}
}
