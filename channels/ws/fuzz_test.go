package ws

import (
	"encoding/json"
	"testing"

	"github.com/turnguard/turnguard/internal/jsonstr"
)

// FuzzFrame feeds arbitrary inbound frames through the parsing a request
// goes through (frame, params of every method, session key) and checks that
// nothing panics, every refusal has a message, and every response the
// server would send is valid JSON. It also checks the hand-written string
// encoder against encoding/json on the same bytes.
func FuzzFrame(f *testing.F) {
	for _, s := range []string{
		`{"type":"req","id":"1","method":"connect","params":{"minProtocol":4,"maxProtocol":4,"auth":{"token":"T"}}}`,
		`{"type":"req","id":"2","method":"chat.send","params":{"sessionKey":"main","message":"hi","idempotencyKey":"k","timeoutMs":5}}`,
		`{"type":"req","id":"3","method":"chat.abort","params":{"sessionKey":"agent:main:main","preserveSideRuns":true}}`,
		`{"type":"req","id":"4","method":"agent","params":{"message":"x","idempotencyKey":"k","timeout":1.5}}`,
		`{"type":"req","id":5,"method":"health"}`,
		`{"type":"req","id":"6","method":"chat.history","params":[1,2]}`,
		`{"type":"req","id":"7","method":"sessions.describe","params":{"key":"agent:"}}`,
		`{"type":"req","id":"8","method":"approval.resolve","params":{"id":"ap_0123456789abcdef01","optionId":"allow","sessionKey":"main"}}`,
		`{"type":"req","id":"9","method":"plugin.approval.resolve","params":{"id":"ap_x","decision":"allow-once"}}`,
		`{"type":"req","id":"10","method":"approval.resolve","params":{"id":["x"],"optionId":{}}}`,
		`{"type":"req","id":"11","method":"approval.list","params":{"sessionKey":"agent:main:\u0000"}}`,
		`{"type":"req","id":`,
		"{\"type\":\"req\",\"id\":\"\xff\",\"method\":\"\\u2028\"}",
		`null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, want := decodeString(t, jsonstr.Append(nil, string(data))), decodeString(t, mustJSON(string(data))); got != want {
			t.Fatalf("jsonstr.Append(%q) decodes to %q, encoding/json to %q", data, got, want)
		}
		req, err := parseFrame(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			checkJSON(t, resFrame(req.ID, nil, invalid("%s", err.Error())).data)
			return
		}
		params := []any{&connectParams{}, &chatSendParams{}, &chatAbortParams{}, &historyParams{}, &agentParams{},
			&agentWaitParams{}, &sessionsListParams{}, &keyParams{}, &approvalResolveParams{}, &pluginResolveParams{},
			&approvalListParams{}}
		for _, p := range params {
			if rerr := decodeParams(req.Method, req.Params, p); rerr != nil {
				if rerr.Message == "" || rerr.Code != CodeInvalidRequest {
					t.Fatalf("refusal %+v", rerr)
				}
				checkJSON(t, resFrame(req.ID, nil, rerr).data)
			}
		}
		var sp chatSendParams
		if decodeParams(req.Method, req.Params, &sp) == nil {
			if key, rerr := canonicalKey("chat.send", sp.SessionKey); rerr == nil && agentOf(key) == "" {
				t.Fatalf("canonical key %q has no agent", key)
			}
		}
	})
}

func decodeString(t *testing.T, b []byte) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("invalid JSON string %q: %v", b, err)
	}
	return s
}

func checkJSON(t *testing.T, b []byte) {
	t.Helper()
	if !json.Valid(b) {
		t.Fatalf("invalid response %s", b)
	}
}
