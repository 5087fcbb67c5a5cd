package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/natstest"
	"github.com/turnguard/turnguard/internal/pgtest"
)

// clusterConfig is a replica's configuration on dbURL and natsURL with
// the cluster keys in extra (indented under cluster:).
func clusterConfig(dbURL, natsURL, extra string) string {
	return fmt.Sprintf(`server:
  listen: 127.0.0.1:0
  token: %s
store:
  driver: postgres
  url: %q
cluster:
  enabled: true
  replicaID: r1
  secret: gateway-binary-test-cluster-secret-0123456789
  nats:
    urls: [%q]
%s`, testToken, dbURL, natsURL, extra)
}

// The built gateway refuses cluster.enabled with no NATS credentials, and
// says which keys would do (issue 19: anyone who can reach NATS would
// otherwise be a replica).
func TestBinaryRefusesAClusterWithoutNATSCredentials(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(path, []byte(clusterConfig("postgres://u@127.0.0.1:1/db", "nats://127.0.0.1:1", "")), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, gatewayBin, "-config", path)
	cmd.Dir, cmd.Env = dir, cleanEnv()
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("the gateway did not refuse to start (err %v):\n%s", err, out)
	}
	if !strings.Contains(string(out), "cluster.nats: has no credentials") || !strings.Contains(string(out), "insecureTrustedNetwork") {
		t.Fatalf("the refusal does not name the missing credentials:\n%s", out)
	}
}

// With cluster.nats.insecureTrustedNetwork the gateway joins a NATS
// without authentication, and says at start-up what that exposes.
func TestBinaryWarnsOfAnInsecureTrustedNetwork(t *testing.T) {
	nats := natstest.Start(t, 1)
	p := startGateway(t, "", clusterConfig(pgtest.New(t), nats.URL(0), "    insecureTrustedNetwork: true\n"))
	p.waitLog("joined the cluster", 30*time.Second)
	if !strings.Contains(p.log(), "NATS without credentials (cluster.nats.insecureTrustedNetwork: true)") {
		t.Fatalf("no warning at start-up:\n%s", p.log())
	}
}
