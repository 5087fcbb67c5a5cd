// Package cluster_test is the scale-out end-to-end suite (issue 12): three
// built gateway replicas on one PostgreSQL and a three-node NATS JetStream
// cluster, all real processes on loopback (internal/clusterrig), driven
// through the WebSocket protocol, the fake Telegram Bot API, the operator
// API and the real openclaw CLI, while replicas, NATS nodes and PostgreSQL
// are killed, stopped and restarted. Every test asserts what users see.
//
// `make cluster-e2e` installs what they need and runs them with
// TURNGUARD_CLUSTER_E2E=1; without it they skip (plain `go test ./...` and
// `make test` do not start clusters). Under that variable nothing is skipped:
// a missing PostgreSQL, nats-server, gateway build or openclaw CLI fails.
//
// What the tests must guess about the gateway's cluster mode (the shape of a
// busy answer, of the interrupted notice, of a retryable refusal, which
// replica owns a run) lives in guess_test.go, one helper each.
package cluster_test

import (
	"os"
	"testing"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/pgtest"
)

// EnvRun turns the suite on.
const EnvRun = "TURNGUARD_CLUSTER_E2E"

func TestMain(m *testing.M) {
	if os.Getenv(EnvRun) == "1" {
		// Under the suite's variable PostgreSQL is required, never skipped.
		os.Setenv(pgtest.RequireEnv, "1")
	}
	clusterrig.Main(m)
}

// need skips the test unless the suite is on.
func need(t *testing.T) {
	t.Helper()
	if os.Getenv(EnvRun) != "1" {
		t.Skipf("cluster end-to-end test: runs only with %s=1 — `make cluster-e2e` installs what it needs and runs it", EnvRun)
	}
}

// start is need plus clusterrig.Start.
func start(t *testing.T, o clusterrig.Options) *clusterrig.Cluster {
	t.Helper()
	need(t)
	return clusterrig.Start(t, o)
}
