package layout_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/turnguard/turnguard/"

// deps lists the turnguard packages that the packages matching pattern
// import, directly or not (tests excluded: a test may reach across rooms).
func deps(t *testing.T, pattern string) []string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(gobin, "list", "-deps", "-f", "{{.ImportPath}}", module+pattern)
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", pattern, err, out)
	}
	var own []string
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, module) {
			own = append(own, strings.TrimPrefix(p, module))
		}
	}
	return own
}

// mechanismJetStream may be imported by any package: it creates JetStream
// streams and imports nothing of turnguard's (its own rule checks that).
const mechanismJetStream = "cluster/jsstream"

// TestImportsRunOneWay fails when a package imports a room it must not:
// the rule, the offending dependency and the packages checked are named.
func TestImportsRunOneWay(t *testing.T) {
	for _, rule := range []struct {
		packages  string   // a go list pattern below the module
		forbidden []string // path prefixes below the module
		why       string
	}{
		{"event/...", []string{""}, "the vocabulary is a leaf"},
		{"messages/...", []string{"gateway", "channels", "ops", "cmd", "runner", "store", "config", "timeout", "internal"}, "the user texts are vocabulary: they render events and import nothing else"},
		{"timeout/...", []string{""}, "the timeout resolvers are pure"},
		{"runner/...", []string{"gateway", "channels", "ops", "cmd", "store"}, "the engine builds on runners, not the other way"},
		{"store/...", []string{"gateway", "channels", "ops", "cmd", "runner", "cluster"}, "the engine builds on the store, not the other way"},
		{"cluster/pgcoord/...", []string{"gateway", "channels", "ops", "cmd", "runner", "config"}, "the cluster's coordination is below the engine, on the store's schema: the engine calls it, not the other way"},
		{"config/...", []string{"gateway", "channels", "ops", "cmd", "runner", "store"}, "configuration is read by everyone and reads no one"},
		{"gateway/...", []string{"channels", "ops", "cmd"}, "the engine emits events; channels and operators subscribe"},
		{"gateway/abort/...", []string{"messages"}, "the registry carries facts; user texts are rendered at the engine's single exit"},
		{"gateway/maintenance/...", []string{"messages"}, "the scheduler carries facts; user texts are rendered at the engine's single exit"},
		{"channels/...", []string{"ops", "cmd"}, "channels do not reach into the operator side"},
		{"channels/conv/...", []string{"channels/telegram", "channels/ws", "channels/webchat"}, "the shared conversation code serves every channel and imports none"},
		{"ops/...", []string{"channels", "cmd"}, "the operator side does not reach into channels"},
		{"cluster/natsbus/...", []string{"gateway", "channels", "ops", "cmd", "runner", "store", "config", "messages"}, "the cluster transport carries events between replicas: it imports only the vocabulary"},
		{"cluster/lease/...", []string{""}, "a leader lease is a mechanism: it imports nothing of turnguard's but the JetStream mechanism"},
		{"cluster/jsstream/...", []string{""}, "creating JetStream streams is a mechanism: it imports nothing of turnguard's"},
		{"cluster/busauth/...", []string{""}, "the bus's signatures and permissions are a mechanism: they import nothing of turnguard's"},
		{"cluster/tgupdates/...", []string{""}, "Telegram updates cross replicas as bytes: the channel decodes them; it imports nothing of turnguard's but the JetStream mechanism"},
		{"cluster/node/...", []string{"channels", "ops", "cmd"}, "the cluster's production seam implements the engine's interface below the channels and the operator side"},
		{"cluster/inproc/...", []string{"channels", "ops", "cmd", "store", "cluster"}, "the in-process cluster is the seam's test double: the gateway's types and the vocabulary only"},
		{"cluster/clustertest/...", []string{"channels", "ops", "cmd", "store", "cluster"}, "the conformance suite sees a cluster only through gateway.Cluster"},
	} {
		own := strings.TrimSuffix(rule.packages, "/...")
		for _, dep := range deps(t, rule.packages) {
			if dep == own || strings.HasPrefix(dep, own+"/") || dep == mechanismJetStream {
				continue
			}
			for _, f := range rule.forbidden {
				if f == "" || dep == f || strings.HasPrefix(dep, f+"/") {
					t.Errorf("%s imports %s: %s", rule.packages, dep, rule.why)
				}
			}
		}
	}
}

// TestClusterSeamImportsFew fails when an implementation of gateway.Cluster
// (or its suite) imports a turnguard package directly beyond what it is
// built from: the engine's types, the vocabulary and, for cluster/node,
// the store's types and the cluster mechanisms.
func TestClusterSeamImportsFew(t *testing.T) {
	for pattern, allowed := range map[string][]string{
		"cluster/node":        {"gateway", "event", "store", "cluster/pgcoord", "cluster/natsbus", "cluster/lease", "cluster/busauth"},
		"cluster/inproc":      {"gateway", "event"},
		"cluster/clustertest": {"gateway", "event", "internal/faketime", "internal/testwait"},
	} {
		for pkg, deps := range imports(t, pattern) {
			for _, dep := range deps {
				if !slices.Contains(allowed, dep) {
					t.Errorf("%s imports %s: it may import only %v", pkg, dep, allowed)
				}
			}
		}
	}
}

// imports maps each package matching pattern (below the module) to the
// turnguard packages it imports directly (tests excluded).
func imports(t *testing.T, pattern string) map[string][]string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(gobin, "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+pattern)
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", pattern, err, out)
	}
	m := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		pkg := strings.TrimPrefix(f[0], module)
		m[pkg] = nil
		for _, dep := range f[1:] {
			if strings.HasPrefix(dep, module) {
				m[pkg] = append(m[pkg], strings.TrimPrefix(dep, module))
			}
		}
	}
	return m
}

// TestChannelsSeeTurnsAsValues fails when a channel imports the abort
// registry or the scheduler itself: channels see a turn only through the
// engine's values (gateway.TurnStatus, gateway.StopResult), so the engine's
// machinery can change without touching a channel. (They still depend on
// those packages through gateway; only a direct import is a reach-in.)
// The operator side (ops/) still imports both for its live-turn list and
// scheduler counters; it is not checked here.
func TestChannelsSeeTurnsAsValues(t *testing.T) {
	forbidden := []string{"gateway/abort", "gateway/maintenance"}
	pkgs := imports(t, "channels/...")
	if len(pkgs) == 0 {
		t.Fatal("go list found no package under channels/")
	}
	for pkg, deps := range pkgs {
		for _, dep := range deps {
			for _, f := range forbidden {
				if dep == f || strings.HasPrefix(dep, f+"/") {
					t.Errorf("%s imports %s: a channel sees turns through gateway.TurnStatus and gateway.StopResult, not the engine's machinery", pkg, dep)
				}
			}
		}
	}
}
