package admin_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/turnguard/turnguard/ops/admin"
	"github.com/turnguard/turnguard/runner/demo"
)

// TestDiagnoseRunnerProbe: /api/diagnose shows each runner's last probe
// and lists a runner that cannot work among its problems (issue 22).
func TestDiagnoseRunnerProbe(t *testing.T) {
	checked := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	e := newEnvRunner(t, testConfig(t), demo.New(), func(o *admin.Options) {
		o.Runners = func() []admin.RunnerHealth {
			return []admin.RunnerHealth{{Runner: "openai", Problem: "the model provider at http://127.0.0.1:9/v1 does not answer: connect: connection refused", CheckedAt: checked}}
		}
	})
	code, body := e.do(t, http.MethodGet, "/api/diagnose")
	var d admin.Diagnosis
	if err := json.Unmarshal([]byte(body), &d); code != http.StatusOK || err != nil {
		t.Fatalf("GET /api/diagnose: %d %s (%v)", code, body, err)
	}
	want := "runner openai: the model provider at http://127.0.0.1:9/v1 does not answer: connect: connection refused"
	if len(d.Runners) != 1 || d.Runners[0].OK || !slices.Contains(d.Problems, want) {
		t.Errorf("runners %+v, problems %q; want openai failing, and %q", d.Runners, d.Problems, want)
	}
}
