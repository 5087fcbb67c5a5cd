package openai

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
)

// TestProbe: the start-up probe of the provider (issue 22: a runner against
// http://127.0.0.1:9/v1 started happily and the first user found out). A
// closed loopback port, a refused key and a slow provider are problems
// named without the URL's query; any other answer (even a 404: an endpoint
// without /models) is fine. Each probe returns within its context.
func TestProbe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	answer := func(code int) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/models" || r.Header.Get("Authorization") != "Bearer sk-probe-key" {
				t.Errorf("probe %s with %q", r.URL.Path, r.Header.Get("Authorization"))
			}
			w.WriteHeader(code)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	t.Cleanup(hang.Close)
	for _, tc := range []struct {
		name, base, want string
	}{
		{"closed port", closed, "the model provider at " + closed + "/v1 does not answer: connect: connection refused"},
		{"refused key", answer(http.StatusUnauthorized), "refuses the API key (HTTP 401); check agents.openai.apiKey"},
		{"no answer in time", hang.URL, "does not answer: no answer in time"},
		{"answers", answer(http.StatusOK), ""},
		{"answers without /models", answer(http.StatusNotFound), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(config.OpenAI{BaseURL: tc.base + "/v1?token=q-secret", Model: "m", APIKey: "sk-probe-key"})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			start := time.Now()
			err = r.Probe(ctx)
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("Probe took %v", took)
			}
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Probe = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Probe = %v, want it to contain %q", err, tc.want)
			case err != nil && (strings.Contains(err.Error(), "q-secret") || strings.Contains(err.Error(), "sk-probe-key")):
				t.Errorf("Probe error shows a secret: %v", err)
			}
		})
	}
}
