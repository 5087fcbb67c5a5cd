package admin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store/storetest"
)

// doBody is env.do with a request body.
func (e *env) doBody(t *testing.T, method, path, body, bearer string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// waitQuestion waits until the engine has an open question.
func (e *env) waitQuestion(t *testing.T) event.Approval {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		if open := e.eng.PendingApprovals(""); len(open) > 0 {
			return open[0]
		}
		time.Sleep(time.Millisecond) // real time: the demo runner asks on its own goroutine
	}
	t.Fatal("the demo runner asked nothing")
	return event.Approval{}
}

// TestApprovalsAPI: GET /api/approvals lists the open questions; POST
// /api/approvals/{id} answers one as operator; the turn goes on; a second
// answer is a no-op that reports the first; errors in words.
func TestApprovalsAPI(t *testing.T) {
	e := newEnv(t, testConfig(t))
	if code, body := e.do(t, http.MethodGet, "/api/approvals"); code != 200 || !strings.Contains(body, `"count": 0`) {
		t.Fatalf("empty list: %d %s", code, body)
	}
	e.send(t, "r-1", "agent:main:a", "ws", "", "/steps ask:deploy say:Finished")
	q := e.waitQuestion(t)

	code, body := e.do(t, http.MethodGet, "/api/approvals")
	var list struct {
		Count     int
		Approvals []map[string]any
	}
	if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil || list.Count != 1 {
		t.Fatalf("list: %d %s", code, body)
	}
	got := list.Approvals[0]
	if got["id"] != q.ID || got["runId"] != "r-1" || got["sessionKey"] != "agent:main:a" || got["title"] != "Run deploy" ||
		!strings.Contains(got["text"].(string), "Run deploy") || got["expiresInMs"].(float64) <= 0 || len(got["options"].([]any)) != 2 {
		t.Fatalf("question %v", got)
	}

	for _, tc := range []struct {
		path, body, bearer string
		code               int
		err                string
	}{
		{"/api/approvals/" + q.ID, `{"optionId":"allow"}`, "", 401, "unauthorized"},
		{"/api/approvals/" + q.ID, `{"optionId":"allow"}`, "wrong", 401, "unauthorized"},
		{"/api/approvals/ap_nope", `{"optionId":"allow"}`, opToken, 404, "no open question has that id"},
		{"/api/approvals/" + strings.Repeat("x", 500), `{"optionId":"allow"}`, opToken, 404, "no open question"},
		{"/api/approvals/" + q.ID, `{"optionId":"maybe"}`, opToken, 400, `optionId \"maybe\" is not one of the question's options`},
		{"/api/approvals/" + q.ID, `{}`, opToken, 400, "send {"},
		{"/api/approvals/" + q.ID, `[1`, opToken, 400, "send {"},
		{"/api/approvals/" + q.ID, `{"optionId":"` + strings.Repeat("a", 8000) + `"}`, opToken, 400, "too large"},
	} {
		if code, body := e.doBody(t, http.MethodPost, tc.path, tc.body, tc.bearer); code != tc.code || !strings.Contains(body, tc.err) {
			t.Errorf("POST %s %.40s: %d %s, want %d %q", tc.path[:min(len(tc.path), 40)], tc.body, code, body, tc.code, tc.err)
		}
	}

	code, body = e.doBody(t, http.MethodPost, "/api/approvals/"+q.ID, `{"optionId":"allow"}`, opToken)
	if code != 200 || !strings.Contains(body, `"already": false`) || !strings.Contains(body, `"by": "operator"`) ||
		!strings.Contains(body, "✅ Allowed by the operator: Run deploy") {
		t.Fatalf("answer: %d %s", code, body)
	}
	out, ok := e.eng.Wait(context.Background(), "r-1")
	if !ok || out.Text != "deploy ran (allowed). Finished" {
		t.Fatalf("turn after the answer: %+v", out)
	}
	code, body = e.doBody(t, http.MethodPost, "/api/approvals/"+q.ID, `{"optionId":"deny"}`, opToken)
	if code != 200 || !strings.Contains(body, `"already": true`) || !strings.Contains(body, `"optionId": "allow"`) {
		t.Fatalf("second answer: %d %s", code, body)
	}
	if code, body := e.do(t, http.MethodGet, "/api/approvals"); code != 200 || !strings.Contains(body, `"count": 0`) {
		t.Fatalf("list after: %d %s", code, body)
	}
}

// TestApprovalsAPIExpired: an operator's answer to a question the gateway
// restarted under (the store has it expired) is told how it ended.
func TestApprovalsAPIExpired(t *testing.T) {
	e := newEnv(t, testConfig(t))
	tr := storetest.NewTurn("r-old", "agent:main:a")
	storetest.HandleAll(e.st, tr.Ev(event.ApprovalRequested, time.Second, func(ev *event.Event) {
		ev.Approval = storetest.Approval("ap_old")
	}))
	storetest.Flush(t, e.st)
	if n, err := e.st.ExpireOrphanApprovals(context.Background()); err != nil || n != 1 {
		t.Fatalf("ExpireOrphanApprovals = %d, %v", n, err)
	}
	code, body := e.doBody(t, http.MethodPost, "/api/approvals/ap_old", `{"optionId":"allow"}`, opToken)
	if code != 404 || !strings.Contains(body, "no longer open: it expired (the gateway running its turn stopped while it waited)") {
		t.Fatalf("answer to an expired question: %d %s", code, body)
	}
}
