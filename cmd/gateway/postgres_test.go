package main

// Process tests of the gateway on PostgreSQL (store.driver postgres): the
// built binary against the test binary's throwaway server (internal/pgtest).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/postgres"
)

// pgConfig is crashConfig on PostgreSQL; the URL comes from the file when
// dbURL is not empty, otherwise from GATEWAY_STORE__URL.
func pgConfig(dbURL string) string {
	keys := "  driver: postgres\n"
	if dbURL != "" {
		keys += fmt.Sprintf("  url: %q\n", dbURL)
	}
	return crashConfigStore(keys)
}

// waitTurnPG polls the database until the turn runID satisfies ok.
func waitTurnPG(t *testing.T, dbURL, runID, what string, ok func(store.Turn) bool) {
	t.Helper()
	// Shared: the test reads the database beside the gateway that holds it.
	st, err := postgres.Open(context.Background(), dbURL, postgres.Options{Logger: slog.New(slog.DiscardHandler), Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	waitTurnIn(t, st, runID, what, ok)
}

// TestPostgresCrashInterruptedNoticeOnce: on PostgreSQL, a turn over
// WebSocket is answered and kept; a turn killed (SIGKILL) in the middle of
// `/steps shell:hang` is ended at the next start as interrupted, and its
// user finds exactly one interrupted notice in chat.history, after that
// restart and after another.
func TestPostgresCrashInterruptedNoticeOnce(t *testing.T) {
	dbURL := pgtest.New(t)
	cfg, env := pgConfig(""), "GATEWAY_STORE__URL="+dbURL
	const session = "main"

	p := startGateway(t, "", cfg, env)
	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, session, "run-ok", "/steps web_search:10ms")
	cl.waitEvent("chat", 10*time.Second, chatState("run-ok", "final"))
	waitTurnPG(t, dbURL, "run-ok", "finished", func(tr store.Turn) bool { return tr.State == store.TurnFinished })

	const run = "run-crash"
	chatSend(cl, session, run, "/steps shell:hang")
	cl.waitEvent("agent", 10*time.Second, toolStarted(run, "shell"))
	waitTurnPG(t, dbURL, run, "in step shell", func(tr store.Turn) bool { return tr.CurrentStep.Name == "shell" })
	p.signal(syscall.SIGKILL)
	p.wait(5 * time.Second)

	for restart := 1; restart <= 2; restart++ {
		p := startGateway(t, "", cfg, env)
		cl := dialGateway(t, p.addr, testToken)
		h := history(t, cl, session)
		if got := interruptedNotices(h); len(got) != 1 || !strings.Contains(got[0], "last action was shell") {
			t.Fatalf("after restart %d the history holds the interrupted notices %q; want exactly one naming shell", restart, got)
		}
		var finals int
		for _, m := range h {
			if m.Role == "assistant" && m.StopReason == "stop" {
				finals++
			}
		}
		if finals != 1 {
			t.Errorf("after restart %d the history holds %d answered turns, want the first one: %+v", restart, finals, h)
		}
		p.signal(syscall.SIGTERM)
		if code := p.wait(10 * time.Second); code != 0 {
			t.Fatalf("exit code %d", code)
		}
	}
}

// TestPostgresURLPasswordNeverShown: the password in store.url appears in
// none of -check's output, /api/diagnose, the log, and the error of a
// connection that fails.
func TestPostgresURLPasswordNeverShown(t *testing.T) {
	dbURL := pgtest.New(t)
	pw := pgtest.Password()
	dir := t.TempDir()
	noPassword := func(what, out string) {
		t.Helper()
		if strings.Contains(out, pw) {
			t.Errorf("%s shows the database password:\n%s", what, out)
		}
	}

	// -check, of a good file and of one whose URL is refused.
	for name, cfg := range map[string]string{
		"good": pgConfig(dbURL),
		"bad":  pgConfig(strings.Replace(dbURL, "postgres://", "mysql://", 1)),
	} {
		path := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(gatewayBin, "-check", "-config", path)
		cmd.Env = cleanEnv()
		out, err := runWithin(t, cmd, 10*time.Second)
		noPassword("-check ("+name+")", out)
		if name == "bad" && (err == nil || !strings.Contains(out, "store.url")) {
			t.Errorf("-check of a mysql:// URL: %v\n%s", err, out)
		}
	}

	p := startGateway(t, dir, pgConfig(dbURL))
	var diag struct {
		Config struct {
			Store struct{ Driver, URL string }
		}
	}
	var raw json.RawMessage
	operatorGet(t, p.addr, "/api/diagnose", &raw)
	if err := json.Unmarshal(raw, &diag); err != nil {
		t.Fatal(err)
	}
	if diag.Config.Store.Driver != "postgres" || !strings.Contains(diag.Config.Store.URL, "[redacted]@127.0.0.1") {
		t.Errorf("/api/diagnose shows the store as %+v", diag.Config.Store)
	}
	body := raw
	noPassword("/api/diagnose", string(body))
	p.signal(syscall.SIGTERM)
	p.wait(10 * time.Second)
	noPassword("the log", p.log())
	if !strings.Contains(p.log(), "[redacted]@127.0.0.1") {
		t.Errorf("the log does not name the database:\n%s", p.log())
	}

	// A wrong password: the gateway cannot start and says why, without the
	// password it was given.
	u, _ := url.Parse(dbURL)
	const wrong = "wrong-zzsecret-password"
	u.User = url.UserPassword(u.User.Username(), wrong)
	path := filepath.Join(dir, "wrong.yaml")
	if err := os.WriteFile(path, []byte(pgConfig(u.String())), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gatewayBin, "-config", path)
	cmd.Env = cleanEnv()
	out, err := runWithin(t, cmd, 30*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitError {
		t.Fatalf("start with a wrong password: %v, want exit status %d\n%s", err, exitError, out)
	}
	if strings.Contains(out, wrong) || !strings.Contains(out, "postgres") {
		t.Errorf("the connection error shows the password or does not name the store:\n%s", out)
	}
}
