package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestDiskFullRefusesTurnsAndRecovers runs the built gateway with its store
// on a real 4 MiB tmpfs, fills the file system, and checks what an operator
// and a client see: /readyz 503 with the reason, chat.send refused with a
// retryable UNAVAILABLE in plain words, one store_unwritable alert; then,
// once space is freed, by itself: /readyz 200, a recovered alert, turns
// accepted, and the turns that ended meanwhile recorded. It needs root to
// mount (skipped otherwise; store.TestDiskFullKeepsEndingsAndRecovers
// covers SQLITE_FULL everywhere).
func TestDiskFullRefusesTurnsAndRecovers(t *testing.T) {
	disk := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", disk).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", disk).Run() })

	var mu sync.Mutex
	var hooks []map[string]any
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if json.NewDecoder(r.Body).Decode(&body) == nil {
			mu.Lock()
			hooks = append(hooks, body)
			mu.Unlock()
		}
	}))
	defer hook.Close()
	kinds := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, h := range hooks {
			out = append(out, fmt.Sprint(h["kind"]))
		}
		return out
	}

	dir := t.TempDir()
	p := startGateway(t, dir, fmt.Sprintf(`server:
  listen: 127.0.0.1:0
  token: %s
store:
  path: %s
alerts:
  webhookURL: %s/hook
`, testToken, filepath.Join(disk, "gateway.db"), hook.URL))
	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, "warm", "run-warm", "/steps say:hello")
	cl.waitEvent("chat", 10*time.Second, chatState("run-warm", "final"))

	filler := filepath.Join(disk, "filler")
	fill(t, filler)

	// Big messages until a write fails (the WAL file may still have room
	// for a few).
	var started []string
	refused := false
	for i := 0; i < 30 && !refused; i++ {
		run := fmt.Sprintf("run-big-%d", i)
		res := cl.call("chat.send", map[string]any{"sessionKey": fmt.Sprintf("big-%d", i),
			"message": "/steps say:" + strings.Repeat("x", 90000), "idempotencyKey": run})
		if !res.OK {
			refused = true
			if res.Error == nil || res.Error.Code != "UNAVAILABLE" || !res.Error.Retryable ||
				!strings.Contains(res.Error.Message, "try again shortly") {
				t.Fatalf("chat.send on a full disk: %+v, want UNAVAILABLE, retryable, \"try again shortly\"", res.Error)
			}
			break
		}
		started = append(started, run)
		cl.waitEvent("chat", 10*time.Second, chatState(run, "final"))
		time.Sleep(50 * time.Millisecond) // real time: the gateway's writer runs in another process
		if code, _ := p.get("/readyz"); code == http.StatusServiceUnavailable {
			break
		}
	}
	code, body := p.get("/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "store cannot write") || !strings.Contains(body, "full") {
		t.Fatalf("/readyz on a full disk: %d %s, want 503 saying the store cannot write, disk full", code, body)
	}
	if res := cl.call("chat.send", map[string]any{"sessionKey": "later", "message": "/steps say:x", "idempotencyKey": "run-refused"}); res.OK ||
		res.Error == nil || !res.Error.Retryable {
		t.Fatalf("chat.send while unready: %+v", res.Error)
	}
	waitFor(t, 10*time.Second, "the store_unwritable alert", func() bool { return strings.Contains(strings.Join(kinds(), " "), "store_unwritable") })

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "/readyz 200 after space returned", func() bool { c, _ := p.get("/readyz"); return c == http.StatusOK })
	waitFor(t, 10*time.Second, "the recovered alert", func() bool { return strings.Contains(strings.Join(kinds(), " "), "recovered") })
	if got := kinds(); len(got) != 2 {
		t.Errorf("webhook alerts %v, want [store_unwritable recovered]", got)
	}
	chatSend(cl, "later", "run-after", "/steps say:back")
	cl.waitEvent("chat", 10*time.Second, chatState("run-after", "final"))
	for i, run := range started {
		h := history(t, cl, fmt.Sprintf("big-%d", i))
		if len(h) != 2 || h[1].Role != "assistant" {
			t.Errorf("history of %s after recovery has %d messages, want the question and the reply", run, len(h))
		}
	}
}

// fill writes to path until the file system is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v", path, err)
			}
			return
		}
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(50 * time.Millisecond) // real time: waiting for another process
	}
}
