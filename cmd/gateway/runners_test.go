package main

import (
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/channels/conv"
	"github.com/turnguard/turnguard/cluster/pgcoord"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/runner"
)

// TestRunnerSetPrepare: prepare builds what a configuration names, keeps a
// runner whose settings did not change, rebuilds one whose settings did, and
// changes nothing when one build fails.
func TestRunnerSetPrepare(t *testing.T) {
	s := newRunnerSet(slog.New(slog.DiscardHandler), false)
	cfg := config.Default()
	if err := s.prepare(cfg); err != nil {
		t.Fatal(err)
	}
	if !s.built(config.RunnerDemo) || s.built(config.RunnerOpenAI) || s.built(config.RunnerExec) {
		t.Fatal("the defaults should build the demo runner only")
	}
	demo := s.slots[config.RunnerDemo].built.Load()

	withOpenAI := *cfg
	withOpenAI.Agents.Defaults.Runner = config.RunnerOpenAI
	withOpenAI.Agents.OpenAI.Model = "m1"
	withOpenAI.Channels.WS.Runner = config.RunnerDemo
	if err := s.prepare(&withOpenAI); err != nil {
		t.Fatal(err)
	}
	first := s.slots[config.RunnerOpenAI].built.Load()
	if first == nil || s.slots[config.RunnerDemo].built.Load() != demo {
		t.Fatal("openai not built, or demo rebuilt though unchanged")
	}
	if err := s.prepare(&withOpenAI); err != nil || s.slots[config.RunnerOpenAI].built.Load() != first {
		t.Fatalf("an unchanged configuration rebuilt openai (err %v)", err)
	}
	withOpenAI.Agents.OpenAI.Model = "m2"
	if err := s.prepare(&withOpenAI); err != nil || s.slots[config.RunnerOpenAI].built.Load() == first {
		t.Fatalf("a changed model did not rebuild openai (err %v)", err)
	}

	// exec cannot be built: nothing changes, not even openai's new model.
	second := s.slots[config.RunnerOpenAI].built.Load()
	bad := withOpenAI
	bad.Agents.OpenAI.Model = "m3"
	bad.Channels.WS.Runner = config.RunnerExec
	bad.Agents.Exec.Command = filepath.Join(t.TempDir(), "missing")
	err := s.prepare(&bad)
	if err == nil || !strings.Contains(err.Error(), "agents.exec.command") {
		t.Fatalf("prepare with a missing command = %v, want an error naming agents.exec.command", err)
	}
	if s.built(config.RunnerExec) || s.slots[config.RunnerOpenAI].built.Load() != second {
		t.Error("a failed prepare installed runners")
	}
}

// TestRunnerSetKeepsTelegramsRunner: Telegram runs until a restart once the
// process started with it, so a reload that disables it (which needs a
// restart) and names a new channels.telegram.runner still builds that runner
// — and still requires its settings — or every Telegram turn would fail.
func TestRunnerSetKeepsTelegramsRunner(t *testing.T) {
	cfg := config.Default()
	cfg.Channels.Telegram.Enabled = true
	s := newRunnerSet(slog.New(slog.DiscardHandler), cfg.Channels.Telegram.Enabled)
	if err := s.prepare(cfg); err != nil {
		t.Fatal(err)
	}

	reload := *cfg
	reload.Channels.Telegram.Enabled = false
	reload.Channels.Telegram.Runner = config.RunnerOpenAI
	err := s.prepare(&reload)
	if err == nil || !strings.Contains(err.Error(), "agents.openai.model") {
		t.Fatalf("prepare of a Telegram runner without its model = %v, want an error naming agents.openai.model", err)
	}
	reload.Agents.OpenAI.Model = "m1"
	if err := s.prepare(&reload); err != nil {
		t.Fatal(err)
	}
	if !s.built(config.RunnerOpenAI) {
		t.Error("the still-running Telegram channel's new runner was not built")
	}

	// A process that started without Telegram never runs it.
	off := config.Default()
	s = newRunnerSet(slog.New(slog.DiscardHandler), false)
	off.Channels.Telegram.Runner = config.RunnerOpenAI
	if err := s.prepare(off); err != nil || s.built(config.RunnerOpenAI) {
		t.Errorf("prepare without Telegram = %v, openai built %v; want nil, false", err, s.built(config.RunnerOpenAI))
	}
}

// TestRunnerSlotSteersLikeItsRunner: the engine sees each runner through its
// slot, so busy mode steer reaches a runner only if the slot says whether
// the runner built last steers (the demo runner does; exec does not; nothing
// built, nothing steers). Before, the slot was no runner.Steerer and every
// steered message of the built binary fell back to the queue.
func TestRunnerSlotSteersLikeItsRunner(t *testing.T) {
	s := newRunnerSet(slog.New(slog.DiscardHandler), false)
	runners := s.engineRunners()
	steers := func(name string) bool {
		st, ok := runners[name].(runner.Steerer)
		return ok && st.Steers()
	}
	if steers(config.RunnerDemo) {
		t.Fatal("an unbuilt slot steers")
	}
	cfg := config.Default()
	cfg.Channels.WS.Runner = config.RunnerExec
	cfg.Agents.Exec.Command = "/bin/cat"
	if err := s.prepare(cfg); err != nil {
		t.Fatal(err)
	}
	if !steers(config.RunnerDemo) {
		t.Error("the demo runner steers, its slot does not")
	}
	if steers(config.RunnerExec) {
		t.Error("the exec runner cannot take a message mid-turn, its slot says it can")
	}
}

// TestRunnerSetACP: `runner: acp` builds the acp runner; a change of its
// settings rebuilds it and retires the old one (which then takes no turn,
// and says so in words), and close stops it.
func TestRunnerSetACP(t *testing.T) {
	s := newRunnerSet(slog.New(slog.DiscardHandler), false)
	cfg := config.Default()
	cfg.Agents.Defaults.Runner = config.RunnerACP
	cfg.Agents.ACP.Command = "sh"
	cfg.Agents.ACP.Workdir = t.TempDir()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := s.prepare(cfg); err != nil {
		t.Fatal(err)
	}
	first := s.slots[config.RunnerACP].built.Load()
	if first == nil {
		t.Fatal("acp not built")
	}
	changed := *cfg
	changed.Agents.ACP.IdleSeconds = 60
	if err := s.prepare(&changed); err != nil || s.slots[config.RunnerACP].built.Load() == first {
		t.Fatalf("a changed idleSeconds did not rebuild acp (err %v)", err)
	}
	_, err := first.r.Run(t.Context(), runner.Turn{RunID: "r1", SessionKey: "k", SessionID: "c", Message: "hi"}, nil)
	if u, ok := runner.AsUserError(err); !ok || !strings.Contains(u.Message, "restarted") {
		t.Errorf("a turn on the replaced acp runner: %v, want a message saying it is being restarted", err)
	}
	s.close()
}

// TestRunnerSetACPSignInAlert: the ACP test agent needs a sign-in and
// agents.acp.authMethod is not set. The person reads the sign-in words;
// the operator gets one alert naming the runner and the same reference,
// however many turns fail, and the runner's health (/api/diagnose, the
// dashboard) fails with it. Before, only a log line told the operator.
func TestRunnerSetACPSignInAlert(t *testing.T) {
	node, script := acpTestAgent(t)
	s := newRunnerSet(slog.New(slog.DiscardHandler), false)
	defer s.close()
	var mu sync.Mutex
	var alerts []string
	s.alertSignIn = func(runner string, problem error) {
		mu.Lock()
		defer mu.Unlock()
		alerts = append(alerts, fmt.Sprintf("%s: %v", runner, problem))
	}
	cfg := config.Default()
	cfg.Agents.Defaults.Runner = config.RunnerACP
	cfg.Agents.ACP.Command = node
	cfg.Agents.ACP.Args = []string{script}
	cfg.Agents.ACP.Workdir = t.TempDir()
	cfg.Agents.ACP.Env = map[string]string{"ACP_TEST_AUTH": "1"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := s.prepare(cfg); err != nil {
		t.Fatal(err)
	}
	r := s.slots[config.RunnerACP].built.Load().r
	var refs []string
	for i := range 2 {
		_, err := r.Run(t.Context(), runner.Turn{RunID: fmt.Sprint("r", i), SessionKey: "k", SessionID: "c", Message: "whoami"}, nil)
		u, ok := runner.AsUserError(err)
		if !ok || !strings.Contains(u.Message, "The operator needs to sign it in") {
			t.Fatalf("turn %d: %v, want the sign-in words", i, err)
		}
		refs = append(refs, u.Message[strings.Index(u.Message, "auth-"):][:len("auth-01234567")])
	}
	mu.Lock()
	got := slices.Clone(alerts)
	mu.Unlock()
	if len(got) != 1 || !strings.HasPrefix(got[0], "acp: the ACP agent needs the operator to sign in") ||
		!strings.Contains(got[0], refs[0]) || !strings.Contains(got[0], "agents.acp.authMethod is not set") {
		t.Errorf("alerts %q, want one for acp naming %s", got, refs[0])
	}
	h := s.healthOf()
	if len(h) != 1 || h[0].Runner != config.RunnerACP || h[0].OK || !strings.Contains(h[0].Problem, refs[0]) {
		t.Errorf("health %+v, want acp failing with the sign-in problem", h)
	}
}

// TestRunnerOfSeesTheAgentThroughItsSlot: the engine holds each runner
// through its slot; RunnerOf gives the ACP runner built last, so /help,
// /mode, /status and Telegram's command menu reach the agent (conv.Agent,
// conv.Configurer, conv.SessionLister). Before, the slot was none of them
// and the built binary answered /mode with "This assistant has no modes."
func TestRunnerOfSeesTheAgentThroughItsSlot(t *testing.T) {
	s := newRunnerSet(slog.New(slog.DiscardHandler), false)
	defer s.close()
	cfg := config.Default()
	cfg.Agents.Defaults.Runner = config.RunnerACP
	cfg.Agents.ACP.Command = "sh"
	cfg.Agents.ACP.Workdir = t.TempDir()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	eng, err := gateway.New(gateway.Options{Config: config.NewSource(cfg), Runners: s.engineRunners()})
	if err != nil {
		t.Fatal(err)
	}
	if r := eng.RunnerOf(config.ChannelWS); r != s.engineRunners()[config.RunnerACP] {
		t.Fatalf("before the runner is built RunnerOf = %T, want the slot", r)
	}
	if err := s.prepare(cfg); err != nil {
		t.Fatal(err)
	}
	r := eng.RunnerOf(config.ChannelWS)
	_, agent := r.(conv.Agent)
	_, settings := r.(conv.Configurer)
	_, sessions := r.(conv.SessionLister)
	if !agent || !settings || !sessions {
		t.Errorf("RunnerOf = %T: agent %v, settings %v, sessions %v", r, agent, settings, sessions)
	}
}

// TestRunnerProbeAtStart: an openai runner whose provider does not answer
// (a closed loopback port) is built and the set does not wait for it; the
// probe, aside, logs a warning naming the runner and the endpoint and keeps
// the problem for /api/diagnose (issue 22: the first user found out).
func TestRunnerProbeAtStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String() + "/v1"
	ln.Close()
	var logs strings.Builder
	var mu sync.Mutex
	s := newRunnerSet(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil)), false)
	s.probing = true
	cfg := *config.Default()
	cfg.Agents.Defaults.Runner = config.RunnerOpenAI
	cfg.Agents.OpenAI.Model = "llama3.2"
	cfg.Agents.OpenAI.BaseURL = base
	if err := s.prepare(&cfg); err != nil {
		t.Fatalf("prepare = %v: an unreachable provider must not stop the start", err)
	}
	s.probes.Wait()
	h := s.healthOf()
	want := "the model provider at " + base + " does not answer: connect: connection refused"
	if len(h) != 1 || h[0].Runner != config.RunnerOpenAI || h[0].OK || h[0].Problem != want {
		t.Fatalf("health %+v, want openai failing with %q", h, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if l := logs.String(); !strings.Contains(l, "level=WARN msg=\"runner cannot work: turns on it will fail until this is fixed\" runner=openai") {
		t.Errorf("no start-up warning:\n%s", l)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestTakeoverLogFields: a takeover is logged as fields — the replica and
// epoch taken over, the turn count and run ids (at most maxLoggedRuns) —
// not a Go struct dump (issue 22: takeover="{Replica:r1 Epoch:3 … Turns:[…]}").
func TestTakeoverLogFields(t *testing.T) {
	tk := pgcoord.Takeover{Replica: "r1", Epoch: 3, Overdue: 1500 * time.Millisecond}
	for i := range 12 {
		tk.Turns = append(tk.Turns, pgcoord.TakenTurn{RunID: fmt.Sprintf("run-%d", i), Notice: "⚠️ Your request was interrupted"})
	}
	var b strings.Builder
	slog.New(slog.NewTextHandler(&b, nil)).Warn("took over", takeoverAttrs(tk)...)
	want := `from_replica=r1 from_epoch=3 overdue_ms=1500 turns=12 runs=run-0,run-1,run-2,run-3,run-4,run-5,run-6,run-7,run-8,run-9` + "\n"
	if got := b.String(); !strings.HasSuffix(got, want) || strings.Contains(got, "{") || strings.Contains(got, "interrupted") {
		t.Errorf("log line %q, want it to end %q", got, want)
	}
	// One batch of a large takeover says that more follow.
	b.Reset()
	tk.More = true
	slog.New(slog.NewTextHandler(&b, nil)).Warn("took over", takeoverAttrs(tk)...)
	if got := b.String(); !strings.HasSuffix(got, strings.TrimSuffix(want, "\n")+" more=true\n") {
		t.Errorf("a batch's log line %q, want it to end with more=true", got)
	}
}
