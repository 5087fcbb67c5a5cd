package acp_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/turnguard/turnguard/runner/acp"
)

// TestAgentCommandsAndModes: the Node SDK agent's available_commands_update
// and session/new modes are kept per conversation; a "/echo x" prompt (an
// agent command, sent as prompt text) is answered by the agent; /mode's
// session/set_mode switches the mode, which the agent confirms with
// current_mode_update; an unknown mode is refused without a call; another
// conversation and one with no session yet have their own (none).
func TestAgentCommandsAndModes(t *testing.T) {
	r, _, _ := newRunner(t, grace, nil)
	a := &conv{key: "alice", id: "conv-a1"}

	if got := r.Commands("alice"); got != nil {
		t.Errorf("commands before any session: %v", got)
	}
	if _, ok := r.Modes("alice"); ok {
		t.Error("modes before any session: ok")
	}
	if err := r.SetMode(context.Background(), "alice", "code"); !errors.Is(err, acp.ErrNoSession) {
		t.Errorf("SetMode before any session: %v, want ErrNoSession", err)
	}

	if got := mustSay(t, r, a.turn("/echo hello there")); got != "echo: hello there" {
		t.Fatalf("/echo: %q", got)
	}
	want := []acp.Command{{Name: "echo", Description: "Say the input back"}, {Name: "mode", Description: "Which mode the session is in"}}
	if got := r.Commands("alice"); !slices.Equal(got, want) {
		t.Errorf("commands: %v, want %v", got, want)
	}
	ms, ok := r.Modes("alice")
	if !ok || ms.Current != "ask" || len(ms.Available) != 2 || ms.Available[1].ID != "code" || ms.Available[1].Name != "Code" {
		t.Fatalf("modes: %+v %v, want ask of ask, code", ms, ok)
	}

	if err := r.SetMode(context.Background(), "alice", "nope"); !errors.Is(err, acp.ErrUnknownMode) {
		t.Errorf("SetMode nope: %v, want ErrUnknownMode", err)
	}
	if err := r.SetMode(context.Background(), "alice", "code"); err != nil {
		t.Fatalf("SetMode code: %v", err)
	}
	if ms, _ := r.Modes("alice"); ms.Current != "code" {
		t.Errorf("current mode after set_mode: %q", ms.Current)
	}
	if got := mustSay(t, r, a.turn("/mode")); got != "mode code" {
		t.Errorf("the agent's mode after set_mode: %q", got)
	}
	if _, ok := r.Modes("bob"); ok {
		t.Error("another conversation has modes before its first turn")
	}
}

// TestModesSurviveARestart: after a gateway restart the conversation's
// restored session (session/resume, session/load) brings its modes back
// from the agent's answer, with the mode set before the restart current.
func TestModesSurviveARestart(t *testing.T) {
	for _, caps := range []string{"resume", "load"} {
		t.Run(caps, func(t *testing.T) {
			g := newSessionsRig(t, caps, 60)
			c := &conv{key: "alice", id: "conv-a1"}
			mustSay(t, g.r, c.turn("remember the blue door"))
			if err := g.r.SetMode(context.Background(), "alice", "code"); err != nil {
				t.Fatal(err)
			}
			gatewayRestart(g, c)
			if got := mustSay(t, g.r, c.turn("what did I say")); got != "You said: the blue door" {
				t.Fatalf("not restored: %q", got)
			}
			if ms, ok := g.r.Modes("alice"); !ok || ms.Current != "code" || len(ms.Available) != 2 {
				t.Errorf("modes after the restart: %+v %v, want code of 2", ms, ok)
			}
		})
	}
}
