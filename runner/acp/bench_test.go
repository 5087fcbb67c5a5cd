package acp_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/acp"
)

// BenchmarkTurn is what a person waits for per message, from Run to the
// reply, with the real Node agent, in the three ways a gateway can drive an
// ACP agent:
//
//   - warm: one process, one ACP session per conversation kept across
//     turns (what the acp runner does);
//   - new-session: one process, a new ACP session every turn (what /new,
//     or a runner that keeps no session, costs);
//   - new-process: a new agent process per turn — start, initialize,
//     session/new, prompt, stop: the exec runner's model applied to an
//     ACP agent (the baseline).
//
// Run with: go test -run '^$' -bench Turn -benchtime 200x ./runner/acp/
func BenchmarkTurn(b *testing.B) {
	node, args := nodeAgent(b)
	cfg := func() config.ACP {
		return config.ACP{Command: node, Args: args, Workdir: b.TempDir(), IdleSeconds: 600, StartTimeoutSeconds: 30}
	}
	turn := func(b *testing.B, r *acp.Runner, session string, i int) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		msg := fmt.Sprintf("hello %d", i)
		res, err := r.Run(ctx, runner.Turn{RunID: fmt.Sprintf("r%d", i), SessionKey: "k", SessionID: session, Message: msg}, runner.Nop{})
		if err != nil || res.Text != "echo: "+msg {
			b.Fatalf("turn %d: %q, %v", i, res.Text, err)
		}
	}
	newRunner := func(b *testing.B) *acp.Runner {
		r, err := acp.New(cfg(), time.Second, nil)
		if err != nil {
			b.Fatal(err)
		}
		return r
	}
	b.Run("warm", func(b *testing.B) {
		r := newRunner(b)
		defer r.Close()
		turn(b, r, "s", -1) // the process and the session start here, not in the loop
		b.ResetTimer()
		for i := range b.N {
			turn(b, r, "s", i)
		}
	})
	b.Run("new-session", func(b *testing.B) {
		r := newRunner(b)
		defer r.Close()
		turn(b, r, "warmup", -1)
		b.ResetTimer()
		for i := range b.N {
			turn(b, r, fmt.Sprintf("s%d", i), i)
		}
	})
	b.Run("new-process", func(b *testing.B) {
		for i := range b.N {
			r := newRunner(b)
			turn(b, r, "s", i)
			if err := r.Close(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
