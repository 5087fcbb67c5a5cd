//go:build e2e

package acp_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
)

// CodexEnv names the codex-acp binary (npm @zed-industries/codex-acp, its
// linux-x64 package) that e2e/run.sh installs; the test fails without it.
const CodexEnv = "TURNGUARD_CODEX_ACP"

// scriptedResponses is an OpenAI Responses API server on loopback that
// answers every request with one streamed assistant message: "reply N to:
// <the last user text>". It records the requests.
type scriptedResponses struct {
	mu     sync.Mutex
	reqs   []string
	bodies []string // of the /responses requests
}

func (s *scriptedResponses) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	s.mu.Lock()
	s.reqs = append(s.reqs, r.Method+" "+r.URL.Path)
	n := len(s.reqs)
	s.mu.Unlock()
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/responses") {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Input []struct {
			Role    string `json:"role"`
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
		} `json:"input"`
	}
	_ = json.Unmarshal(body, &req)
	s.mu.Lock()
	s.bodies = append(s.bodies, string(body))
	s.mu.Unlock()
	last := ""
	for _, in := range req.Input {
		if in.Role == "user" {
			for _, c := range in.Content {
				if c.Type == "input_text" {
					last = c.Text
				}
			}
		}
	}
	text := fmt.Sprintf("reply %d to: %s", n, strings.TrimSpace(last))
	w.Header().Set("Content-Type", "text/event-stream")
	id := fmt.Sprintf("resp_%d", n)
	for _, ev := range []map[string]any{
		{"type": "response.created", "response": map[string]any{"id": id}},
		{"type": "response.output_text.delta", "delta": text, "item_id": "msg_1", "output_index": 0, "content_index": 0},
		{"type": "response.output_item.done", "item": map[string]any{"type": "message", "role": "assistant", "id": "msg_1",
			"content": []map[string]any{{"type": "output_text", "text": text}}}},
		{"type": "response.completed", "response": map[string]any{"id": id,
			"usage": map[string]any{"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}},
	} {
		b, _ := json.Marshal(ev)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev["type"], b)
	}
}

// TestCodexACP: the production Codex adapter (codex-acp), offline, its
// model a scripted Responses server on loopback: two turns of one
// conversation answer through the acp runner, in one session, on one
// process.
func TestCodexACP(t *testing.T) {
	bin := os.Getenv(CodexEnv)
	if bin == "" {
		t.Fatalf("%s is not set; run the end-to-end tests with `make e2e`", CodexEnv)
	}
	model := &scriptedResponses{}
	srv := httptest.NewServer(model)
	defer srv.Close()
	home := filepath.Join(t.TempDir(), "codex-home") // not under /tmp's top: codex refuses helper binaries there
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`model = "gpt-5.4-mini"
model_provider = "scripted"
approval_policy = "never"
sandbox_mode = "read-only"

[model_providers.scripted]
name = "scripted"
base_url = "%s/v1"
wire_api = "responses"
env_key = "SCRIPTED_KEY"
`, srv.URL)
	if err := os.WriteFile(filepath.Join(home, "config.toml"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config.ACP{Command: bin, Workdir: t.TempDir(), IdleSeconds: 60, StartTimeoutSeconds: 60,
		Env: map[string]string{"CODEX_HOME": home, "SCRIPTED_KEY": "local-test-key"}}
	r, logs, _ := build(t, cfg, 2*time.Second)
	c := &conv{key: "k", id: "c"}
	for i, msg := range []string{"hello codex", "and again"} {
		text, err := say(t, r, c.turn(msg))
		if err != nil {
			t.Fatalf("turn %d: %v\n%s", i, err, cutLog(logs.String()))
		}
		if !strings.HasPrefix(text, "reply ") || !strings.HasSuffix(text, " to: "+msg) {
			t.Errorf("turn %d: reply %q, want the scripted model's answer to %q", i, text, msg)
		}
	}
	model.mu.Lock()
	last := model.bodies[len(model.bodies)-1]
	model.mu.Unlock()
	if !strings.Contains(last, "hello codex") {
		t.Errorf("the second turn's model request lacks the first turn: the session's context was lost")
	}
	if n := strings.Count(logs.String(), "acp: session opened"); n != 1 {
		t.Errorf("%d sessions opened for one conversation, want 1", n)
	}
}
