package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/ops/tracing"
)

// otelcolBin returns the OTLP receiver built by `make bin/otelcol`
// (TURNGUARD_OTELCOL). Without it the test is skipped — unless
// TURNGUARD_REQUIRE_OTELCOL=1 (make test), when it fails.
func otelcolBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("TURNGUARD_OTELCOL")
	if bin == "" {
		bin = filepath.Join("..", "..", "bin", "otelcol")
	}
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("TURNGUARD_REQUIRE_OTELCOL") == "1" {
			t.Fatalf("no OTLP receiver at %s (make bin/otelcol): %v", bin, err)
		}
		t.Skipf("no OTLP receiver at %s (make bin/otelcol builds it)", bin)
	}
	return bin
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startOtelcol runs the receiver on two free loopback ports and returns
// them and the file it writes.
func startOtelcol(t *testing.T) (grpcAddr, httpAddr, out string) {
	t.Helper()
	bin := otelcolBin(t)
	grpcAddr, httpAddr, out = freeAddr(t), freeAddr(t), filepath.Join(t.TempDir(), "traces.jsonl")
	cmd := exec.Command(bin, "-grpc", grpcAddr, "-http", httpAddr, "-out", out)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for _, a := range []string{grpcAddr, httpAddr} {
		deadline := time.Now().Add(30 * time.Second)
		for {
			c, err := net.Dial("tcp", a)
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the receiver does not listen on %s: %v", a, err)
			}
			time.Sleep(20 * time.Millisecond) // real time: waiting for another process to listen
		}
	}
	return grpcAddr, httpAddr, out
}

// otlpSpan is a span of the receiver's OTLP JSON.
type otlpSpan struct {
	TraceID, SpanID, ParentSpanID, Name string
	Attributes                          []struct {
		Key   string
		Value map[string]any
	}
	Events []struct{ Name string }
	Status struct{ Code int }
}

func (s otlpSpan) attr(key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			for _, v := range a.Value {
				return fmt.Sprint(v)
			}
		}
	}
	return ""
}

// readSpans reads every span the receiver wrote, by trace id.
func readSpans(t *testing.T, path string) map[string][]otlpSpan {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]otlpSpan{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var batch struct {
			ResourceSpans []struct {
				ScopeSpans []struct{ Spans []otlpSpan }
			}
		}
		if err := json.Unmarshal(sc.Bytes(), &batch); err != nil {
			t.Fatal(err)
		}
		for _, rs := range batch.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					out[s.TraceID] = append(out[s.TraceID], s)
				}
			}
		}
	}
	return out
}

// operator sends an operator API request to the gateway.
func operator(t *testing.T, p *gatewayProc, method, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+p.addr+path, strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var b strings.Builder
	_, _ = bufio.NewReader(res.Body).WriteTo(&b)
	return res.StatusCode, b.String()
}

// TestTracesReachARealReceiver: the built gateway, with
// telemetry.otlp.endpoint set, exports each turn's trace over OTLP (gRPC,
// then HTTP) to a real receiver: a finished turn, one an operator stopped
// and one the shutdown stopped, each a root span with its steps as
// children; the trace id is the one /api/turns and the log lines show.
func TestTracesReachARealReceiver(t *testing.T) {
	grpcAddr, httpAddr, out := startOtelcol(t)
	for _, tc := range []struct{ protocol, endpoint string }{
		{"grpc", grpcAddr},
		{"http", "http://" + httpAddr},
	} {
		t.Run(tc.protocol, func(t *testing.T) {
			dir := t.TempDir()
			cfg := testConfig(dir, 2) + fmt.Sprintf(`telemetry:
  serviceName: turnguard-e2e
  otlp:
    endpoint: %s
    protocol: %s
    insecure: true
    headers:
      x-e2e-secret: "otlp-header-SECRET"
`, tc.endpoint, tc.protocol)
			p := startGateway(t, dir, cfg)
			cl := dialGateway(t, p.addr, testToken)
			done, stopped, shut := tc.protocol+"-done", tc.protocol+"-stopped", tc.protocol+"-shut"

			chatSend(cl, "a", done, "/steps web_search:50ms llm:50ms say:ok")
			cl.waitEvent("chat", 10*time.Second, chatState(done, "final"))

			chatSend(cl, "b", stopped, "/steps shell:hang")
			cl.waitEvent("agent", 10*time.Second, toolStarted(stopped, "shell"))
			code, body := operator(t, p, http.MethodGet, "/api/turns")
			if code != 200 || !strings.Contains(body, `"traceId":"`+tracing.TraceIDString(stopped)+`"`) &&
				!strings.Contains(body, `"traceId": "`+tracing.TraceIDString(stopped)+`"`) {
				t.Errorf("/api/turns does not show the trace id %s: %d %s", tracing.TraceIDString(stopped), code, body)
			}
			if code, body := operator(t, p, http.MethodPost, "/api/turns/"+stopped+"/abort"); code != 200 {
				t.Fatalf("abort: %d %s", code, body)
			}
			ab := aborted(t, cl.waitEvent("chat", 10*time.Second, chatState(stopped, "aborted")))

			chatSend(cl, "c", shut, "/steps llm:20ms shell:hang")
			cl.waitEvent("agent", 10*time.Second, toolStarted(shut, "shell"))
			p.signal(syscall.SIGTERM)
			if code := p.wait(15 * time.Second); code != 0 {
				t.Fatalf("exit code %d", code)
			}
			if strings.Contains(p.log(), "otlp-header-SECRET") {
				t.Error("the log shows the OTLP header's secret")
			}
			// The operator's abort is logged with the turn's trace id.
			if !strings.Contains(p.log(), `"run":"`+stopped+`"`) ||
				!strings.Contains(p.log(), `"trace_id":"`+tracing.TraceIDString(stopped)+`"`) {
				t.Errorf("no log line of %s with its trace_id:\n%s", stopped, p.log())
			}

			spans := readSpans(t, out)
			for _, c := range []struct {
				run, reason string
				steps       []string
				error       bool
			}{
				{done, "stop", []string{"web_search/tool", "demo/llm"}, false},
				{stopped, ab.StopReason, []string{"shell/tool"}, false},
				{shut, "shutdown", []string{"demo/llm", "shell/tool"}, true},
			} {
				tid := tracing.TraceIDString(c.run)
				var root *otlpSpan
				var children []otlpSpan
				for _, s := range spans[tid] {
					if s.ParentSpanID == "" {
						root = &s
					} else {
						children = append(children, s)
					}
				}
				if root == nil {
					t.Errorf("%s: no root span in trace %s (%d spans received in all)", c.run, tid, len(spans))
					continue
				}
				if root.Name != "turn" || root.attr(tracing.AttrRunID) != c.run || root.attr(tracing.AttrRunner) != "demo" ||
					root.attr(tracing.AttrChannel) != "ws" || root.attr(tracing.AttrStopReason) != c.reason {
					t.Errorf("%s: root %+v", c.run, *root)
				}
				if isErr := root.Status.Code == 2; isErr != c.error {
					t.Errorf("%s: root status %d, want error %v", c.run, root.Status.Code, c.error)
				}
				var steps []string
				for _, s := range children {
					if s.ParentSpanID != root.SpanID {
						t.Errorf("%s: span %s is not the root's child", c.run, s.Name)
					}
					steps = append(steps, s.Name+"/"+s.attr(tracing.AttrStepKind))
				}
				slices.Sort(steps)
				want := slices.Clone(c.steps)
				slices.Sort(want)
				if !slices.Equal(steps, want) {
					t.Errorf("%s: steps %v, want %v", c.run, steps, want)
				}
				if c.run != done {
					var names []string
					for _, e := range root.Events {
						names = append(names, e.Name)
					}
					if !slices.Contains(names, "aborted") {
						t.Errorf("%s: root events %v, want aborted", c.run, names)
					}
				}
			}
		})
	}
}
