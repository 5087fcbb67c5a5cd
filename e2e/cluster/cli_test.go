package cluster_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
)

// The real OpenClaw CLI (make cluster-e2e installs it into .e2e/, as make
// e2e does).
const (
	EnvNode     = "TURNGUARD_NODE"     // Node 24
	EnvOpenClaw = "TURNGUARD_OPENCLAW" // openclaw.mjs
)

// openclaw runs the CLI with args against a gateway; it returns stdout and
// stderr and fails the test on a non-zero exit or after 60 s.
func openclaw(t *testing.T, url string, args ...string) (string, string) {
	t.Helper()
	node, cli := os.Getenv(EnvNode), os.Getenv(EnvOpenClaw)
	if node == "" || cli == "" {
		t.Fatalf("%s and %s must name Node 24 and openclaw.mjs (make cluster-e2e sets them)", EnvNode, EnvOpenClaw)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{cli}, args...)...)
	home := t.TempDir()
	cmd.Env = []string{ // isolated: nothing under ~ is read or written
		"HOME=" + home, "OPENCLAW_HOME=" + home,
		"OPENCLAW_STATE_DIR=" + filepath.Join(home, "state"),
		"OPENCLAW_CONFIG_PATH=" + filepath.Join(home, "state", "openclaw.json"),
		"OPENCLAW_NO_AUTO_UPDATE=1", "OPENCLAW_DISABLE_BONJOUR=1",
		"OPENCLAW_GATEWAY_URL=" + url, "OPENCLAW_GATEWAY_TOKEN=" + clusterrig.Token,
		"PATH=" + filepath.Dir(node) + ":/usr/bin:/bin", "LANG=C.UTF-8",
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("$ openclaw %s → %v\n%s%s", strings.Join(args, " "), err, &stdout, &stderr)
	if ctx.Err() != nil {
		t.Fatalf("openclaw %s: no answer within 60s", strings.Join(args, " "))
	}
	if err != nil {
		t.Fatalf("openclaw %s: %v\n%s%s", strings.Join(args, " "), err, &stdout, &stderr)
	}
	return stdout.String(), stderr.String()
}

// TestOpenClawCLIOnAnotherReplica: the real `openclaw agent` command talks
// to one replica about a session whose turn runs on another: its message
// waits for that turn (busy mode queue), and the CLI prints its own reply.
// Then a plain send and reply through the CLI on a third replica.
func TestOpenClawCLIOnAnotherReplica(t *testing.T) {
	c := start(t, clusterrig.Options{})
	const sess = "agent:main:cli-cluster"
	first := c.Dial(t, 0)
	first.MustStart(sess, "/steps web_search:3s say:First_answer", "run-cli-first")
	via := others(c, owner(t, c, "run-cli-first"))[0]
	out, _ := openclaw(t, c.Gateway(via).URL(), "agent", "--agent", "main", "--session-key", sess,
		"-m", "/steps say:Hello_through_replica_2")
	if !strings.Contains(out, "Hello through replica 2") {
		t.Errorf("openclaw agent on r%d printed %q; want its reply", via+1, out)
	}
	if e := first.WaitEvent(10*time.Second, "the first turn's end", chatState("run-cli-first", "final")); !strings.Contains(string(e.Raw), "First answer") {
		t.Errorf("the first turn's final %s lacks its answer", e.Raw)
	}

	out, _ = openclaw(t, c.Gateway(2).URL(), "agent", "--agent", "main", "--session-key", "agent:main:cli-plain",
		"-m", "/steps web_search:100ms say:Plain_reply_in_cluster_mode")
	if !strings.Contains(out, "Plain reply in cluster mode") {
		t.Errorf("openclaw agent on r3 printed %q; want its reply", out)
	}
}
