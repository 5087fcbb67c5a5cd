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
	"slices"
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

	p, cl, kinds := startStoreGateway(t, filepath.Join(disk, "gateway.db"), "warm")

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
	waitFor(t, 10*time.Second, "the store_unwritable alert", func() bool { return slices.Contains(kinds(), "store_unwritable") })

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "/readyz 200 after space returned", func() bool { c, _ := p.get("/readyz"); return c == http.StatusOK })
	waitFor(t, 10*time.Second, "the recovered alert", func() bool { return slices.Contains(kinds(), "recovered") })
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

// startStoreGateway starts the built gateway with its store at dbPath and
// operator alerts to a webhook (kinds lists those received), and runs one
// turn ("hello") in session.
func startStoreGateway(t *testing.T, dbPath, session string) (*gatewayProc, *wsClient, func() []string) {
	t.Helper()
	hook, kinds := alertHook(t)
	p := startGateway(t, t.TempDir(), fmt.Sprintf(`server:
  listen: 127.0.0.1:0
  token: %s
store:
  path: %s
alerts:
  webhookURL: %s/hook
`, testToken, dbPath, hook.URL))
	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, session, "run-first", "/steps say:hello")
	cl.waitEvent("chat", 10*time.Second, chatState("run-first", "final"))
	return p, cl, kinds
}

// alertHook is a webhook receiver for operator alerts; kinds lists the
// kinds received so far.
func alertHook(t *testing.T) (*httptest.Server, func() []string) {
	var mu sync.Mutex
	var got []string
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Kind string }
		if json.NewDecoder(r.Body).Decode(&body) == nil {
			mu.Lock()
			got = append(got, body.Kind)
			mu.Unlock()
		}
	}))
	t.Cleanup(hook.Close)
	return hook, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

// TestDatabaseDirectoryRemovedRefusesTurnsAndRecovers: with the built
// gateway, the store's directory is removed (the file and everything next
// to it): the store cannot recreate the file, so /readyz answers 503, new
// turns are refused (retryable) and one alert is sent; once the directory
// is back, the file is recreated from the open copy by itself — history
// kept — and turns are accepted again. Runs without root.
func TestDatabaseDirectoryRemovedRefusesTurnsAndRecovers(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	p, cl, kinds := startStoreGateway(t, filepath.Join(data, "gateway.db"), "main")

	if err := os.RemoveAll(data); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "/readyz 503 after the directory was removed", func() bool {
		c, _ := p.get("/readyz")
		return c == http.StatusServiceUnavailable
	})
	if _, body := p.get("/readyz"); !strings.Contains(body, "deleted or replaced") {
		t.Errorf("/readyz reason %s, want it to say the database file was deleted", body)
	}
	res := cl.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps say:x", "idempotencyKey": "run-refused"})
	if res.OK || res.Error == nil || res.Error.Code != "UNAVAILABLE" || !res.Error.Retryable ||
		!strings.Contains(res.Error.Message, "try again shortly") {
		t.Fatalf("chat.send while the store cannot write: ok=%v %+v", res.OK, res.Error)
	}
	waitFor(t, 10*time.Second, "the store_unwritable alert", func() bool { return slices.Contains(kinds(), "store_unwritable") })

	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "/readyz 200 once the directory is back", func() bool { c, _ := p.get("/readyz"); return c == http.StatusOK })
	waitFor(t, 10*time.Second, "the recovered alert", func() bool { return slices.Contains(kinds(), "recovered") })
	if _, err := os.Stat(filepath.Join(data, "gateway.db")); err != nil {
		t.Fatalf("database file not recreated: %v", err)
	}
	chatSend(cl, "main", "run-after", "/steps say:after")
	cl.waitEvent("chat", 10*time.Second, chatState("run-after", "final"))
	h := history(t, cl, "main")
	if len(h) != 4 || h[1].Content[0].Text != "hello" || h[3].Content[0].Text != "after" {
		t.Errorf("history after recovery = %+v, want before and after", h)
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
