package natsbus

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/natstest"
)

// benchRates are the turns per second the path is driven at. Each turn is
// TurnStarted, StepStarted, two deltas, StepCompleted and Finished (four
// kept events, two deltas) on one of benchSessions sessions.
var benchRates = []int{500, 2000, 4000}

const (
	benchSessions = 2000
	benchSeconds  = 4
)

// latencies collects the publish → handler latency of Finished events.
type latencies struct {
	mu    sync.Mutex
	final []time.Duration
	n     int // every event delivered
}

func (l *latencies) handle(ev event.Event) {
	d := time.Since(ev.Time)
	l.mu.Lock()
	l.n++
	if ev.Kind == event.Finished {
		l.final = append(l.final, d)
	}
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B, turns int, elapsed time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.final) == 0 {
		b.Fatal("no final event delivered")
	}
	slices.Sort(l.final)
	p := func(q float64) float64 {
		return float64(l.final[int(q*float64(len(l.final)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(p(0.50), "final-p50-µs")
	b.ReportMetric(p(0.99), "final-p99-µs")
	b.ReportMetric(p(1), "final-max-µs")
	b.ReportMetric(float64(l.n)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(turns-len(l.final)), "finals-missing")
}

// drive publishes rate turns per second for benchSeconds through publish,
// a millisecond's worth at a time, and returns how many turns it sent.
func drive(rate int, publish func(event.Event)) int {
	keys := make([]string, benchSessions)
	for i := range keys {
		keys[i] = "agent:main:bench:" + strconv.Itoa(i)
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	sent := 0
	for now := range tick.C {
		el := now.Sub(start)
		if el >= benchSeconds*time.Second {
			break
		}
		due := int(el.Seconds()*float64(rate)) + 1
		for ; sent < due; sent++ {
			key, run := keys[sent%benchSessions], "r"+strconv.Itoa(sent)
			for j, k := range []event.Kind{event.TurnStarted, event.StepStarted, event.Delta, event.Delta, event.StepCompleted, event.Finished} {
				publish(event.Event{Kind: k, RunID: run, SessionKey: key, Seq: uint64(j + 1), Time: time.Now(),
					Text: "chunk", FullText: "the reply so far", Step: event.Step{Kind: event.StepTool, Name: "shell", Seq: 1}})
			}
		}
	}
	return sent
}

// BenchmarkClusterPath: owner Publish on node 0 → stream (R3) and core
// delivery → an all-sessions watcher on a connection to node 2 → its
// handler, in one process (one clock). Run with -benchtime=1x: each rate
// runs benchSeconds whatever b.N is.
func BenchmarkClusterPath(b *testing.B) {
	c := natstest.Start(b, 3)
	cfg := Config{Replicas: 3}
	x := newExporter(b, connect(b, c, 0), ExporterOptions{Config: cfg})
	for _, rate := range benchRates {
		b.Run(fmt.Sprintf("turns=%d", rate), func(b *testing.B) {
			l := new(latencies)
			w, err := Watch(testContext(b, 10*time.Second), connect(b, c, 2), "", l.handle,
				func(err *GapError) { b.Errorf("gap: %v", err) }, WatchOptions{Config: cfg})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Stop()
			start := time.Now()
			turns := drive(rate, x.Publish)
			deadline := time.Now().Add(10 * time.Second)
			for {
				l.mu.Lock()
				got := len(l.final)
				l.mu.Unlock()
				if got >= turns || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond) // real time: the last frames on their way through real servers
			}
			l.report(b, turns, time.Since(start))
			b.Logf("exporter %+v; watcher %+v", x.Stats(), w.Stats())
		})
	}
}

// BenchmarkBusPath is the baseline: the same turns through the
// same-process event.Bus to one all-sessions subscriber.
func BenchmarkBusPath(b *testing.B) {
	for _, rate := range benchRates {
		b.Run(fmt.Sprintf("turns=%d", rate), func(b *testing.B) {
			bus := event.NewBus()
			l := new(latencies)
			bus.Subscribe("", l.handle)
			start := time.Now()
			turns := drive(rate, bus.Publish)
			l.report(b, turns, time.Since(start))
		})
	}
}

// BenchmarkImportReceive is what a replica's watcher of every session
// spends on one frame it receives (issue 21, three replicas: each frame
// reaches every replica), in process, without NATS: a frame its own
// exporter published (SkipOrigin), one of a session it does not show
// (Follow says no) and one of a session it shows. The frames are a turn's
// — TurnStarted, StepStarted, two deltas, StepCompleted, Finished — over
// benchSessions sessions, each session's numbered in order.
func BenchmarkImportReceive(b *testing.B) {
	for _, c := range []struct {
		name   string
		origin string
		follow bool
	}{{"own", "me", true}, {"unshown", "other", false}, {"shown", "other", true}} {
		b.Run(c.name, func(b *testing.B) {
			opt := WatchOptions{SkipOrigin: "me"}
			opt.Follow = func(string) bool { return c.follow }
			w := &Watcher{opt: opt.withDefaults(), h: func(event.Event) {}, sessions: map[string]*watchSession{}, live: map[string]*watchSession{}}
			msgs := make([]*nats.Msg, b.N)
			seqs := make([]uint64, benchSessions)
			kinds := []event.Kind{event.TurnStarted, event.StepStarted, event.Delta, event.Delta, event.StepCompleted, event.Finished}
			for i := range msgs {
				turn, j := i/len(kinds), i%len(kinds)
				s := turn % benchSessions
				f := frame{kind: frameEvent, tenure: c.origin + ".1", ev: event.Event{Kind: kinds[j], RunID: "r" + strconv.Itoa(turn),
					SessionKey: "agent:main:bench:" + strconv.Itoa(s), Channel: "ws", Seq: uint64(j + 1), Time: time.Now(),
					Text: "chunk", FullText: "the reply so far", Step: event.Step{Kind: event.StepTool, Name: "shell", Seq: 1}}}
				if kinds[j] == event.Delta {
					f.kind, f.seq = frameDelta, seqs[s]
				} else {
					seqs[s]++
					f.seq = seqs[s]
				}
				msgs[i] = &nats.Msg{Data: appendFrame(nil, &f)}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for _, m := range msgs {
				w.receive(m)
			}
		})
	}
}
