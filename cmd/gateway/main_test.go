package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/testwait"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// runCLI runs the program in-process for invocations that end before
// serving (flags, -check, a configuration that cannot start).
func runCLI(t *testing.T, vars map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	exit := func(c int) { t.Fatalf("exit(%d) called for %v", c, args) }
	code = run(args, &out, &errOut, env(vars), make(chan os.Signal), exit)
	return code, out.String(), errOut.String()
}

func TestCommandLine(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		env        map[string]string
		wantCode   int
		wantStdout string
		wantStderr string
		notStderr  string
	}{
		{name: "check valid", args: []string{"-check", "-config", "testdata/valid.yaml"},
			wantCode: exitOK, wantStdout: "config OK: testdata/valid.yaml"},
		{name: "check defaults", args: []string{"-check"},
			wantCode: exitOK, wantStdout: "config OK: built-in defaults and environment"},
		{name: "check unknown key", args: []string{"-check", "-config", "testdata/unknown_key.yaml"},
			wantCode: exitError, wantStderr: `unknown key "agents.defaults.stepTimeout" (did you mean "agents.defaults.stepTimeoutSeconds"?)`},
		{name: "check missing file", args: []string{"-check", "-config", "testdata/nope.yaml"},
			wantCode: exitError, wantStderr: "testdata/nope.yaml"},
		{name: "check off loopback without token", args: []string{"-check", "-config", "testdata/offloopback.yaml"},
			wantCode: exitError, wantStderr: "server.token is required when server.listen (0.0.0.0:0) is not a loopback address"},
		{name: "check off loopback with token", args: []string{"-check", "-config", "testdata/offloopback_token.yaml"},
			wantCode: exitOK, wantStdout: "config OK", notStderr: "a-secret-token-value"},
		{name: "check warns of a clamp", args: []string{"-check", "-config", "../../config/testdata/check/above_ceiling.yaml"},
			wantCode: exitOK, wantStdout: "warning: agents.defaults.timeoutSeconds: 7200 (2 h) is above the hard maximum of 3600 (1 h, " +
				"the built-in maxTurnTimeSeconds), so turns stop at 1 h; raise maxTurnTimeSeconds or lower timeoutSeconds\n" +
				"config OK with 1 warning: ../../config/testdata/check/above_ceiling.yaml"},
		{name: "check lists several problems one a line", args: []string{"-check", "-config", "../../config/testdata/check/several.yaml"},
			wantCode: exitError, wantStderr: "4 problems:\n  server.sendQueue: must be a whole number, got a string\n"},
		{name: "print config", args: []string{"-print-config", "-config", "testdata/valid.yaml"},
			wantCode: exitOK, wantStdout: "server.token: \"[redacted]\"  # file\n", notStderr: "check-token-value"},
		{name: "refuses to start off loopback without token", args: []string{"-config", "testdata/offloopback.yaml"},
			wantCode: exitError, wantStderr: "server.token is required when server.listen (0.0.0.0:0) is not a loopback address"},
		{name: "version", args: []string{"-version"}, wantCode: exitOK, wantStdout: "turnguard gateway " + version},
		{name: "unknown flag", args: []string{"-nope"}, wantCode: exitUsage, wantStderr: "usage: gateway"},
		{name: "stray argument", args: []string{"serve"}, wantCode: exitUsage, wantStderr: `unexpected argument "serve"`},
		{name: "bad log format", args: []string{"-config", "testdata/valid.yaml"}, env: map[string]string{"GATEWAY_LOG_FORMAT": "xml"},
			wantCode: exitUsage, wantStderr: `GATEWAY_LOG_FORMAT must be text or json, got "xml"`},
		{name: "bad log level", args: []string{"-config", "testdata/valid.yaml"}, env: map[string]string{"GATEWAY_LOG_LEVEL": "loud"},
			wantCode: exitUsage, wantStderr: `GATEWAY_LOG_LEVEL must be debug, info, warn or error, got "loud"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tc.env, tc.args...)
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.wantCode, stdout, stderr)
			}
			if !strings.Contains(stdout, tc.wantStdout) {
				t.Errorf("stdout %q does not contain %q", stdout, tc.wantStdout)
			}
			if !strings.Contains(stderr, tc.wantStderr) {
				t.Errorf("stderr %q does not contain %q", stderr, tc.wantStderr)
			}
			if tc.notStderr != "" && strings.Contains(stderr+stdout, tc.notStderr) {
				t.Errorf("output reveals %q", tc.notStderr)
			}
		})
	}
}

func TestLogger(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		json    bool
		debug   bool
		wantErr string
	}{
		{name: "default is text at info", env: map[string]string{}},
		{name: "text", env: map[string]string{"GATEWAY_LOG_FORMAT": "text"}},
		{name: "json", env: map[string]string{"GATEWAY_LOG_FORMAT": "json"}, json: true},
		{name: "json any case", env: map[string]string{"GATEWAY_LOG_FORMAT": " JSON "}, json: true},
		{name: "debug level", env: map[string]string{"GATEWAY_LOG_LEVEL": "debug"}, debug: true},
		{name: "bad format", env: map[string]string{"GATEWAY_LOG_FORMAT": "yaml"}, wantErr: "GATEWAY_LOG_FORMAT"},
		{name: "bad level", env: map[string]string{"GATEWAY_LOG_LEVEL": "chatty"}, wantErr: "GATEWAY_LOG_LEVEL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			log, err := newLogger(&buf, env(tc.env))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			log.Debug("dbg line")
			log.Info("listening", "addr", "127.0.0.1:1")
			out := buf.String()
			if got := strings.Contains(out, "dbg line"); got != tc.debug {
				t.Errorf("debug line logged = %v, want %v:\n%s", got, tc.debug, out)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			last := lines[len(lines)-1]
			var rec map[string]any
			isJSON := json.Unmarshal([]byte(last), &rec) == nil
			if isJSON != tc.json {
				t.Fatalf("JSON output = %v, want %v: %q", isJSON, tc.json, last)
			}
			if tc.json && (rec["msg"] != "listening" || rec["addr"] != "127.0.0.1:1") {
				t.Errorf("JSON record %v", rec)
			}
			if !tc.json && !strings.Contains(last, "msg=listening addr=127.0.0.1:1") {
				t.Errorf("text record %q", last)
			}
		})
	}
}

// TestExampleConfigChecks: the example configuration the README points a
// newcomer to passes `gateway -check` with no problem and no warning, so CI
// catches a key renamed under it.
func TestExampleConfigChecks(t *testing.T) {
	const example = "../../examples/turnguard.yaml"
	code, stdout, stderr := runCLI(t, nil, "-check", "-config", example)
	if code != exitOK || stdout != "config OK: "+example+"\n" {
		t.Fatalf("-check %s: exit %d\nstdout: %s\nstderr: %s", example, code, stdout, stderr)
	}
}

// TestStartupNamesSourcesAndClamps: the start-up log names the file and the
// GATEWAY_ variables in force (was config="(built-in defaults)") and warns
// of a value not used as written (issue 22: a timeoutSeconds above the
// ceiling was clamped silently).
func TestStartupNamesSourcesAndClamps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.yaml")
	cfg := "server:\n  listen: 127.0.0.1:0\nagents:\n  defaults:\n    timeoutSeconds: 7200\nstore:\n  path: " +
		filepath.Join(dir, "gateway.db") + "\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GATEWAY_AGENTS__DEFAULTS__STEPTIMEOUTSECONDS", "60")
	var mu sync.Mutex
	var out, errOut strings.Builder
	sig := make(chan os.Signal, 1)
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"-config", path}, lockedWriter{&mu, &out}, lockedWriter{&mu, &errOut}, env(nil), sig,
			func(c int) { t.Errorf("exit(%d)", c) })
	}()
	logged := func() string { mu.Lock(); defer mu.Unlock(); return errOut.String() }
	testwait.Until(t, 20*time.Second, "the listening line", func() bool { return strings.Contains(logged(), "msg=listening") })
	sig <- syscall.SIGTERM
	if code := <-done; code != exitOK {
		t.Errorf("exit %d", code)
	}
	l := logged()
	for _, want := range []string{
		`config="` + path + ` + GATEWAY_AGENTS__DEFAULTS__STEPTIMEOUTSECONDS"`,
		`level=WARN msg="config: a value is not used as written" key=agents.defaults.timeoutSeconds warning="agents.defaults.timeoutSeconds: 7200 (2 h) is above the hard maximum`,
	} {
		if !strings.Contains(l, want) {
			t.Errorf("start-up log lacks %q:\n%s", want, l)
		}
	}
}
