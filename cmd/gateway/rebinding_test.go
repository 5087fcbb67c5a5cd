package main

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestBinaryWithoutTokenServesOnlyLocalNames: the built gateway with no
// token (the default make run) refuses a DNS-rebound page — Host
// evil.example on its loopback port — on every route the page uses and on
// the WebSocket, and still serves the same routes addressed as 127.0.0.1
// or a name listed in server.allowedHosts.
func TestBinaryWithoutTokenServesOnlyLocalNames(t *testing.T) {
	dir := t.TempDir()
	p := startGateway(t, dir, "server:\n  listen: 127.0.0.1:0\n  allowedHosts: [gateway.lan]\nstore:\n  path: "+
		filepath.Join(dir, "gateway.db")+"\n")
	_, port, _ := strings.Cut(p.addr, ":")
	get := func(path, host string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+p.addr+path, nil)
		req.Host = host
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	for _, path := range []string{"/", "/healthz", "/readyz", "/api/turns"} {
		if code := get(path, "evil.example:"+port); code != http.StatusForbidden {
			t.Errorf("GET %s as evil.example: %d, want 403", path, code)
		}
		if code := get(path, "127.0.0.1:"+port); code != http.StatusOK {
			t.Errorf("GET %s as 127.0.0.1: %d, want 200", path, code)
		}
	}
	if code := get("/", "gateway.lan:"+port); code != http.StatusOK {
		t.Errorf("GET / as a listed name: %d", code)
	}
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	h := http.Header{"Host": {"evil.example:" + port}, "Origin": {"http://evil.example:" + port}}
	if c, res, err := d.Dial("ws://"+p.addr+"/", h); err == nil {
		c.Close()
		t.Fatal("the rebound page opened the WebSocket")
	} else if res == nil || res.StatusCode != http.StatusForbidden {
		t.Fatalf("rebound WebSocket: %v %v, want 403", res, err)
	}
	cl := dialGateway(t, p.addr, "")
	if r := cl.call("health", nil); !r.OK {
		t.Fatalf("the local client: %+v", r)
	}
}
