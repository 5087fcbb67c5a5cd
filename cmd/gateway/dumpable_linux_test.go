package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestAgentCannotReadTheGatewaysEnvironment: a process of the gateway's
// own user — what an exec or ACP agent is — cannot read the built
// gateway's /proc/<pid>/environ (its GATEWAY_* secrets), which is root's.
// Root reads any process's files, so under root (as in CI) the gateway and
// the reader both run as nobody; otherwise both as the test's user.
func TestAgentCannotReadTheGatewaysEnvironment(t *testing.T) {
	const secret = "GATEWAY_SERVER__TOKEN=dumpable-test-secret-0123456789"
	var cred *syscall.Credential // nil: the test's own user
	if os.Geteuid() == 0 {
		cred = &syscall.Credential{Uid: 65534, Gid: 65534}
	}
	as := func(c *exec.Cmd) { c.SysProcAttr = &syscall.SysProcAttr{Credential: cred} }
	// A directory and a binary the gateway's user can reach.
	dir, err := os.MkdirTemp("", "turnguard-dumpable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "gateway")
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, gatewayBin, bin, 0o755)

	p := startGatewayCmd(t, dir, "", func(c *exec.Cmd) { c.Path = bin; as(c) },
		"GATEWAY_SERVER__LISTEN=127.0.0.1:0", "GATEWAY_STORE__PATH=:memory:", secret)
	environ := filepath.Join("/proc", strconv.Itoa(p.cmd.Process.Pid), "environ")
	fi, err := os.Stat(environ)
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 0 {
		t.Errorf("%s belongs to uid %d, want root's (the gateway is not dumpable)", environ, uid)
	}
	cat := exec.Command("cat", environ)
	as(cat)
	out, err := cat.CombinedOutput()
	if err == nil || strings.Contains(string(out), "dumpable-test-secret") {
		t.Fatalf("a process of the gateway's user read its environment (err %v):\n%q", err, out)
	}
	if !strings.Contains(string(out), "Permission denied") {
		t.Errorf("cat: %v: %s", err, out)
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}
