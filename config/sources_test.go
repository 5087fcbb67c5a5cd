package config

import (
	"slices"
	"strings"
	"testing"
)

// TestPrintConfig: -print-config shows every set key with its value,
// secrets redacted, and where it came from (issue 22); Sources names the
// file and the GATEWAY_ variables in force, for the start-up line.
func TestPrintConfig(t *testing.T) {
	const token = "env-token-0123456789abcdef"
	c := mustLoad(t, "testdata/check/above_ceiling.yaml", "GATEWAY_SERVER__TOKEN="+token,
		"GATEWAY_AGENTS__DEFAULTS__STEPTIMEOUTSECONDS=5")
	got := c.PrintConfig()
	for _, want := range []string{
		"# turnguard configuration from testdata/check/above_ceiling.yaml + GATEWAY_AGENTS__DEFAULTS__STEPTIMEOUTSECONDS, GATEWAY_SERVER__TOKEN; secrets redacted\n",
		"\nagents.defaults.timeoutSeconds: 7200  # file\n",
		"\nagents.defaults.stepTimeoutSeconds: 5  # env GATEWAY_AGENTS__DEFAULTS__STEPTIMEOUTSECONDS\n",
		"\nserver.token: \"[redacted]\"  # env GATEWAY_SERVER__TOKEN\n",
		"\nserver.operatorToken: \"[redacted]\"  # server.token's (env GATEWAY_SERVER__TOKEN)\n",
		"\nserver.listen: \"127.0.0.1:18789\"  # default\n",
		"\n# ws: timeoutSeconds 3600, stepTimeoutSeconds 5, maxTurnTimeSeconds 3600,",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("-print-config lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, token) {
		t.Errorf("-print-config shows the token:\n%s", got)
	}
	for _, tc := range []struct {
		file    string
		environ []string
		want    string
	}{
		{"", nil, "built-in defaults"},
		{"", []string{"GATEWAY_SERVER__TOKEN=" + token}, "built-in defaults + GATEWAY_SERVER__TOKEN"}, // was "(built-in defaults)"
		{"testdata/check/ok.yaml", nil, "testdata/check/ok.yaml"},
	} {
		if got := mustLoad(t, tc.file, tc.environ...).Sources(); got != tc.want {
			t.Errorf("Sources(%q, %q) = %q, want %q", tc.file, tc.environ, got, tc.want)
		}
	}
}

// TestChanged: what hot reload logs as changed — the keys whose values
// differ, a secret named but never shown.
func TestChanged(t *testing.T) {
	old := mustLoad(t, "testdata/check/ok.yaml", "GATEWAY_SERVER__TOKEN=first-token-0123456789")
	next := mustLoad(t, "testdata/check/above_ceiling.yaml", "GATEWAY_SERVER__TOKEN=second-token-0123456789")
	got := Changed(old, next)
	want := []string{"agents.defaults.timeoutSeconds", "server.operatorToken (secret)", "server.token (secret)"}
	if !slices.Equal(got, want) {
		t.Errorf("Changed = %q, want %q", got, want)
	}
	if got := Changed(old, old); len(got) != 0 {
		t.Errorf("Changed(c, c) = %q", got)
	}
}
