package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/turnguard/turnguard/gateway/errlog"
	"github.com/turnguard/turnguard/runner"
)

// failingRunner fails the way an exec agent does — an error carrying the
// last stderr lines, with a traceback that prints a configured secret — or
// panics with a secret in the panic value.
var failingRunner = runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
	cb.StepStarted("tool", "shell")
	if turn.Message == "panic" {
		panic("connect to db with password " + secrets[6])
	}
	return runner.Result{}, fmt.Errorf("exec agent: %w", errors.New("exit status 1; stderr:\n"+
		"Traceback (most recent call last):\n  File \"agent.py\", line 7, in <module>\n"+
		"openai.AuthenticationError: Incorrect API key provided: "+secrets[2]))
})

var errorID = regexp.MustCompile(`\(error id (E[0-9A-Z]{5})\)`)

// TestErrorDetailsOnlyForOperators: the user of a failed turn reads an error
// id and nothing of the failure; GET /api/errors/{id} gives the operator
// the details, secrets redacted.
func TestErrorDetailsOnlyForOperators(t *testing.T) {
	e := newEnvRunner(t, testConfig(t), failingRunner)
	for _, tc := range []struct{ text, detail string }{
		{"hi", "Traceback (most recent call last)"},
		{"panic", "connect to db with password"},
	} {
		e.send(t, "r-"+tc.text, "agent:main:"+tc.text, "ws", "", tc.text)
		out, _ := e.eng.Wait(context.Background(), "r-"+tc.text)
		_, hist, _ := e.eng.History(context.Background(), "agent:main:"+tc.text, 0)
		user := out.Message + "\n" + hist[len(hist)-1].Text
		for _, leak := range []string{"Traceback", "exit status", "panic", "password", "AuthenticationError", secrets[2], secrets[6], "goroutine"} {
			if strings.Contains(user, leak) {
				t.Errorf("%s: the user reads %q:\n%s", tc.text, leak, user)
			}
		}
		m := errorID.FindStringSubmatch(out.Message)
		if m == nil {
			t.Fatalf("%s: no error id in %q", tc.text, out.Message)
		}
		code, body := e.do(t, http.MethodGet, "/api/errors/"+m[1])
		if code != http.StatusOK {
			t.Fatalf("GET /api/errors/%s: %d %s", m[1], code, body)
		}
		var rec errlog.Record
		if err := json.Unmarshal([]byte(body), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.ID != m[1] || rec.RunID != "r-"+tc.text || !strings.Contains(body, tc.detail) || !strings.Contains(body, errlog.Redaction) {
			t.Errorf("%s: detail %s", tc.text, body)
		}
		if tc.text == "panic" && !strings.Contains(rec.Stack, "goroutine") {
			t.Errorf("panic without its stack: %s", body)
		}
		if !strings.Contains(e.logs.String(), "errorId="+m[1]) {
			t.Errorf("the log does not name error id %s", m[1])
		}
	}
	code, body := e.do(t, http.MethodGet, "/api/errors")
	var list struct{ Count int }
	if json.Unmarshal([]byte(body), &list); code != http.StatusOK || list.Count != 2 {
		t.Fatalf("GET /api/errors: %d %s", code, body)
	}
	if code, _ := e.do(t, http.MethodGet, "/api/errors/EZZZZZ"); code != http.StatusNotFound {
		t.Fatalf("unknown id: %d", code)
	}
	for _, s := range secrets {
		if strings.Contains(e.logs.String(), s) {
			t.Errorf("the log contains the secret %q", s)
		}
	}
}
