package inproc_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/turnguard/turnguard/cluster/clustertest"
	"github.com/turnguard/turnguard/cluster/inproc"
	"github.com/turnguard/turnguard/event"
)

func pair(t *testing.T) clustertest.Pair {
	hub := inproc.NewHub()
	a, b := hub.Join("a"), hub.Join("b")
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	return clustertest.Pair{A: a, B: b,
		ServeA: func(h clustertest.Handler) { a.Serve(h) },
		ServeB: func(h clustertest.Handler) { b.Serve(h) },
		KillA:  func() { a.Kill() }}
}

// The conformance suite, on the real clock and inside synctest bubbles
// (where every goroutine a member started must end with the case).
func TestConformance(t *testing.T) {
	clustertest.Run(t, pair, clustertest.Options{})
}

func TestConformanceInBubbles(t *testing.T) {
	clustertest.Run(t, pair, clustertest.Options{Bubble: true})
}

// An Import handler that falls behind by more than the hub's Queue gets
// its session's overflow as one gap report, in order, then the events that
// came after it; the other session's events are not affected beyond the
// queue's bound.
func TestImportOverflowIsAGapInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hub := inproc.NewHub()
		hub.Queue = 3
		a, b := hub.Join("a"), hub.Join("b")
		defer a.Close()
		release := make(chan struct{})
		var mu sync.Mutex
		var got []string
		stop := b.Import(func(ev event.Event) {
			<-release // the handler is slow until released
			mu.Lock()
			got = append(got, fmt.Sprintf("%s %d", ev.SessionKey, ev.Seq))
			mu.Unlock()
		}, func(key string) {
			mu.Lock()
			got = append(got, "gap "+key)
			mu.Unlock()
		})
		for i := 1; i <= 6; i++ {
			a.Export(event.Event{Kind: event.StepCompleted, SessionKey: "s", Seq: uint64(i)})
			if i == 1 {
				synctest.Wait() // the handler holds 1
			}
		}
		synctest.Wait()
		close(release)
		synctest.Wait()
		a.Export(event.Event{Kind: event.Finished, SessionKey: "s", Seq: 7})
		synctest.Wait()
		stop()
		mu.Lock()
		defer mu.Unlock()
		// 1 is being handled while 2, 3, 4 fill the queue; 5 overflows (the
		// gap), 6 is dropped behind it; 7 comes after the gap was reported.
		if want := []string{"s 1", "s 2", "s 3", "s 4", "gap s", "s 7"}; !slices.Equal(got, want) {
			t.Errorf("imported %q; want %q", got, want)
		}
		a.Export(event.Event{Kind: event.Finished, SessionKey: "s", Seq: 8})
		synctest.Wait()
		if len(got) != 6 {
			t.Errorf("a stopped Import received more: %q", got)
		}
	})
}
