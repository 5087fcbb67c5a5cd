package openai

import (
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
)

// The tool tests call Runner.callTool, which returns exactly the text the
// model receives as the tool's result.

func TestHTTPGet(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/docs/page", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello docs")) })
	mux.HandleFunc("/docs-secret", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("secret")) })
	mux.HandleFunc("/private", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("private")) })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(strings.Repeat("x", 100))) })
	mux.HandleFunc("/redirect-out", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/private", http.StatusFound) })
	mux.HandleFunc("/redirect-in", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/docs/page", http.StatusFound) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	u := srv.URL

	r, err := New(config.OpenAI{Model: "m", Tools: config.OpenAITools{HTTPGet: config.HTTPGetTool{
		Enabled: true, MaxBytes: 16,
		Allow: []string{u + "/docs", u + "/big", u + "/redirect-out", u + "/redirect-in"},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, args, want string
	}{
		{"allowed", `{"url":"` + u + `/docs/page"}`, `{"status":200,"contentType":"text/plain; charset=utf-8","body":"hello docs"}`},
		{"prefix is not a string prefix", `{"url":"` + u + `/docs-secret"}`, "error: " + u + "/docs-secret is not in the allowed URL list (agents.openai.tools.httpGet.allow)"},
		{"other path", `{"url":"` + u + `/private"}`, "error: " + u + "/private is not in the allowed URL list"},
		{"other host", `{"url":"http://evil.example/docs/page"}`, "error: http://evil.example/docs/page is not in the allowed URL list"},
		{"credentials trick", `{"url":"` + strings.Replace(u, "http://", "http://x@", 1) + `/docs/page"}`, "error: URLs with credentials are not allowed"},
		{"dot segments", `{"url":"` + u + `/docs/../private"}`, "error: URLs with . or .. path segments are not allowed"},
		{"encoded dot segments", `{"url":"` + u + `/docs/%2e%2e/private"}`, "error: URLs with . or .. path segments are not allowed"},
		{"file scheme", `{"url":"file:///etc/passwd"}`, `error: only http and https URLs can be fetched, not "file"`},
		{"truncated at maxBytes", `{"url":"` + u + `/big"}`, `{"status":200,"contentType":"text/plain; charset=utf-8","body":"xxxxxxxxxxxxxxxx","truncated":true}`},
		{"redirect inside the list", `{"url":"` + u + `/redirect-in"}`, `{"status":200,"contentType":"text/plain; charset=utf-8","body":"hello docs"}`},
		{"redirect out of the list", `{"url":"` + u + `/redirect-out"}`, "error: fetching " + u + "/redirect-out: redirect refused: " + u + "/private is not in the allowed URL list"},
		{"bad arguments", `{"link":1}`, `error: arguments: want {"url": "https://…"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.callTool(t.Context(), ToolHTTPGet, tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(got, tt.want) {
				t.Errorf("result:\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestHTTPGetTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stall := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
		r, err := New(config.OpenAI{Model: "m", Tools: config.OpenAITools{HTTPGet: config.HTTPGetTool{
			Enabled: true, Allow: []string{"https://slow.example/"}, TimeoutSeconds: 5,
		}}}, WithToolHTTPClient(&http.Client{Transport: pipeTransport{stall}}))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		got, err := r.callTool(t.Context(), ToolHTTPGet, `{"url":"https://slow.example/a"}`)
		if err != nil {
			t.Fatal(err)
		}
		if want := "error: fetching https://slow.example/a timed out after 5s"; got != want {
			t.Errorf("result %q, want %q", got, want)
		}
		if el := time.Since(start); el != 5*time.Second {
			t.Errorf("gave up after %v, want 5s", el)
		}
	})
}

// TestCommandTools runs real processes (real time; the timeout case waits
// 200ms).
func TestCommandTools(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "pwned")
	hostile := `{"q":"$(touch ` + marker + `); rm -rf / ; echo \"` + "`id`" + `\""}`
	tests := []struct {
		name string
		tool config.CommandTool
		args string
		want string
	}{
		{"arguments arrive verbatim on stdin", config.CommandTool{Argv: []string{"cat"}}, hostile, hostile},
		{"fixed argv", config.CommandTool{Argv: []string{"echo", "fixed", "$HOME"}}, `{}`, "fixed $HOME\n"},
		{"output capped", config.CommandTool{Argv: []string{"testdata/big_tool.sh"}, MaxOutputBytes: 10}, `{}`, "xxxxxxxxxx\n[output truncated: 90 more bytes]"},
		{"failure", config.CommandTool{Argv: []string{"testdata/fail_tool.sh"}}, `{}`, "error: command t failed: exit status 2\nstderr: boom\nstdout: partial\n"},
		{"timeout", config.CommandTool{Argv: []string{"testdata/sleep_tool.sh"}, TimeoutSeconds: 0.2}, `{}`, "error: command t timed out after 200ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.tool.Name = "t"
			r, err := New(config.OpenAI{Model: "m", Tools: config.OpenAITools{Commands: []config.CommandTool{tt.tool}}})
			if err != nil {
				t.Fatal(err)
			}
			got, err := r.callTool(t.Context(), "t", tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("result:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("model arguments were interpreted by a shell")
	}
}

func TestNew(t *testing.T) {
	const key = "sk-secret-key-1234567890"
	t.Run("defaults", func(t *testing.T) {
		r, err := New(config.OpenAI{Model: " gpt-4o-mini "})
		if err != nil {
			t.Fatal(err)
		}
		if r.endpoint != "https://api.openai.com/v1/chat/completions" || r.maxSteps != 8 || r.idle != 120*time.Second || r.Model() != "gpt-4o-mini" {
			t.Errorf("endpoint %q maxSteps %d idle %v model %q", r.endpoint, r.maxSteps, r.idle, r.Model())
		}
	})
	t.Run("query kept after the path", func(t *testing.T) {
		r, err := New(config.OpenAI{BaseURL: "https://x.example/openai/deployments/d/?api-version=2024-06-01", Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		if want := "https://x.example/openai/deployments/d/chat/completions?api-version=2024-06-01"; r.endpoint != want {
			t.Errorf("endpoint %q, want %q", r.endpoint, want)
		}
	})
	t.Run("ollama", func(t *testing.T) {
		r, err := New(config.OpenAI{BaseURL: "http://127.0.0.1:11434/v1/", Model: "llama3.2", LLMIdleTimeoutSeconds: 30, MaxSteps: 3})
		if err != nil {
			t.Fatal(err)
		}
		if r.endpoint != "http://127.0.0.1:11434/v1/chat/completions" || r.idle != 30*time.Second || r.maxSteps != 3 {
			t.Errorf("endpoint %q idle %v maxSteps %d", r.endpoint, r.idle, r.maxSteps)
		}
	})
	cmd := func(c config.CommandTool) config.OpenAI {
		if c.Name == "" {
			c.Name = "lookup"
		}
		return config.OpenAI{Model: "m", Tools: config.OpenAITools{Commands: []config.CommandTool{c}}}
	}
	get := func(h config.HTTPGetTool) config.OpenAI {
		h.Enabled = true
		return config.OpenAI{Model: "m", Tools: config.OpenAITools{HTTPGet: h}}
	}
	tests := []struct {
		name string
		cfg  config.OpenAI
		want string
	}{
		{"no model", config.OpenAI{}, "agents.openai.model: required"},
		{"base URL without scheme", config.OpenAI{Model: "m", BaseURL: "localhost:11434"}, "agents.openai.baseURL: not an http(s) URL"},
		{"base URL with credentials", config.OpenAI{Model: "m", BaseURL: "https://user:" + key + "@api.example/v1"}, "agents.openai.baseURL: must not contain credentials"},
		{"key in a bad base URL", config.OpenAI{Model: "m", APIKey: key, BaseURL: "ftp://x/?key=" + key}, "agents.openai.baseURL: not an http(s) URL"},
		{"negative maxSteps", config.OpenAI{Model: "m", MaxSteps: -1}, "agents.openai.maxSteps: must be ≥ 1, got -1"},
		{"NaN idle", config.OpenAI{Model: "m", LLMIdleTimeoutSeconds: math.NaN()}, "agents.openai.llmIdleTimeoutSeconds: must be a number ≥ 0"},
		{"negative idle", config.OpenAI{Model: "m", LLMIdleTimeoutSeconds: -1}, "agents.openai.llmIdleTimeoutSeconds: must be a number ≥ 0, got -1"},
		{"http_get without allow", get(config.HTTPGetTool{}), "agents.openai.tools.httpGet.allow: list at least one URL prefix"},
		{"http_get bad prefix", get(config.HTTPGetTool{Allow: []string{"example.com"}}), `agents.openai.tools.httpGet.allow[0]: "example.com" is not an http(s) URL prefix`},
		{"http_get prefix with query", get(config.HTTPGetTool{Allow: []string{"https://x.example/?a=1"}}), "a prefix has no query or fragment"},
		{"http_get negative maxBytes", get(config.HTTPGetTool{Allow: []string{"https://x.example/"}, MaxBytes: -1}), "agents.openai.tools.httpGet.maxBytes: must be ≥ 1"},
		{"http_get negative timeout", get(config.HTTPGetTool{Allow: []string{"https://x.example/"}, TimeoutSeconds: -2}), "agents.openai.tools.httpGet.timeoutSeconds: must be a number ≥ 0"},
		{"command name with a space", cmd(config.CommandTool{Name: "my tool", Argv: []string{"cat"}}), `agents.openai.tools.commands[0].name: "my tool" must be 1–64 letters, digits, _ or -`},
		{"command named like a built-in", cmd(config.CommandTool{Name: "http_get", Argv: []string{"cat"}}), `"http_get" is a built-in tool`},
		{"command without argv", cmd(config.CommandTool{}), "agents.openai.tools.commands[0].argv: required"},
		{"command not found", cmd(config.CommandTool{Argv: []string{"no-such-tool-xyz"}}), `agents.openai.tools.commands[0].argv[0]: "no-such-tool-xyz"`},
		{"parameters not an object", cmd(config.CommandTool{Argv: []string{"cat"}, Parameters: map[string]any{"type": "string"}}), "parameters: must be a JSON schema with type: object"},
		{"negative timeout", cmd(config.CommandTool{Argv: []string{"cat"}, TimeoutSeconds: -1}), "agents.openai.tools.commands[0].timeoutSeconds: must be a number ≥ 0"},
		{"negative output cap", cmd(config.CommandTool{Argv: []string{"cat"}, MaxOutputBytes: -1}), "maxOutputBytes: must be ≥ 1"},
		{"duplicate names", config.OpenAI{Model: "m", Tools: config.OpenAITools{Commands: []config.CommandTool{
			{Name: "a", Argv: []string{"cat"}}, {Name: "a", Argv: []string{"cat"}},
		}}}, `agents.openai.tools.commands[1].name: "a" is already used by another tool`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New error = %v, want it to contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), key) {
				t.Fatalf("error leaks the key: %v", err)
			}
		})
	}
}

func TestRedact(t *testing.T) {
	const key = "sk-abcdefghijklmnop1234"
	tests := []struct{ in, want string }{
		{"no secret here", "no secret here"},
		{"key " + key + " echoed", "key [redacted] echoed"},
		{`"Bearer ` + key + `"`, `"Bearer [redacted]"`},
		{"masked sk-abcde****1234", "masked [redacted]"},
		{"masked sk-abc****1234 (8 chars: sk-abcdefgh...)", "masked sk-abc****1234 (8 chars: [redacted])"},
		{"suffix ijklmnop1234", "suffix [redacted]"},
		{"short fragment sk-abc stays", "short fragment sk-abc stays"},
	}
	for _, tt := range tests {
		if got := redact(tt.in, key); got != tt.want {
			t.Errorf("redact(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	if got := redact("anything", ""); got != "anything" {
		t.Errorf("empty key changed the text: %q", got)
	}
}
