// Package storetest owns the conformance suite of turnguard's stores: what
// a user or an operator sees of the history, turns, journal, stall history,
// outbox, queued messages, approvals, agent sessions, MarkInterrupted and retention,
// asserted the same way on every implementation of store.Backend. The SQLite store (package
// store) and the PostgreSQL store (store/postgres) run it; a new backend
// passes it before it is wired in. What only one backend has (SQLite's file
// lock, a full disk, a deleted file, its schema's migrations) is tested
// beside that backend.
//
// It also exports the helpers those tests share: turn builders (NewTurn,
// Turn.Ev, Step, Approval, Resolved), HandleAll, Flush, MustHistory,
// MustTurn, MustApproval, Msgs.
package storetest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// Config is what a test asks of the store it opens; a Factory maps it onto
// its backend's options.
type Config struct {
	OutboxChannels []string
	OnOutbox       func(channel string)
	Retention      store.Retention
	BatchSize      int
	// SecondProcess: the store stands in for another process (a replica)
	// using the same data at the same time (SQLite: skip its lock file;
	// PostgreSQL: Shared, no owner lock).
	SecondProcess bool
	// BeforeCommit and AfterCommit, when set, are called by the writer
	// goroutine inside a batch's transaction just before its commit and
	// just after the commit: a test kills the process there.
	BeforeCommit, AfterCommit func()
}

// Factory makes stores for the suite.
type Factory struct {
	// New returns where a fresh, empty store lives (a file path, a URL).
	New func(t *testing.T) string
	// Open opens the store at loc with c, quietly (no log output). The
	// suite closes it at the end of the test; Close may also be called
	// earlier (a restart), so it must be safe to call twice.
	Open func(ctx context.Context, loc string, c Config) (store.Backend, error)
}

// H is a test's handle on the backend under test.
type H struct{ f Factory }

// New returns where a fresh, empty store lives.
func (h *H) New(t *testing.T) string {
	t.Helper()
	return h.f.New(t)
}

// Open opens the store at loc, failing the test if it cannot, and closes
// it at the test's end.
func (h *H) Open(t *testing.T, loc string, c Config) store.Backend {
	t.Helper()
	s, err := h.OpenErr(t, loc, c)
	if err != nil {
		t.Fatalf("open the store: %v", err)
	}
	return s
}

// OpenErr opens the store at loc and closes it at the test's end.
func (h *H) OpenErr(t *testing.T, loc string, c Config) (store.Backend, error) {
	t.Helper()
	s, err := h.f.Open(context.Background(), loc, c)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, nil
}

// Run runs the conformance suite against the stores f makes, one subtest
// per behaviour.
func Run(t *testing.T, f Factory) {
	h := &H{f: f}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.fn(t, h) })
	}
}

type testCase struct {
	name string
	fn   func(t *testing.T, h *H)
}

var cases = []testCase{
	{"RecordFinishedTurn", testRecordFinishedTurn},
	{"TurnEndingsInHistory", testTurnEndingsInHistory},
	{"TurnEndsOnce", testTurnEndsOnce},
	{"TurnEndWithoutStartIsRecorded", testTurnEndWithoutStartIsRecorded},
	{"ReusedRunIDStartsAfresh", testReusedRunIDStartsAfresh},
	{"StepTracking", testStepTracking},
	{"InvalidEventsAreCountedNotWritten", testInvalidEventsAreCountedNotWritten},
	{"CloseWritesQueuedEventsThenDrops", testCloseWritesQueuedEventsThenDrops},
	{"HistoryLimitKeepsTheMostRecent", testHistoryLimitKeepsTheMostRecent},
	{"SessionsMostRecentFirst", testSessionsMostRecentFirst},
	{"RunningTurnsAndMarkInterrupted", testRunningTurnsAndMarkInterrupted},
	{"MarkInterruptedExactlyOnceUnderConcurrency", testMarkInterruptedExactlyOnceUnderConcurrency},
	{"QueriesAfterCloseReturnErrClosed", testQueriesAfterCloseReturnErrClosed},
	{"TurnDeadlinesRecorded", testTurnDeadlinesRecorded},
	{"SessionResetSurvivesRestart", testSessionResetSurvivesRestart},
	{"ResetDuringTurnKeepsItsReplyOut", testResetDuringTurnKeepsItsReplyOut},
	{"OutboxLifecycle", testOutboxLifecycle},
	{"OutboxDedup", testOutboxDedup},
	{"EnqueueRejectsBadInput", testEnqueueRejectsBadInput},
	{"OutboxPartsSentAndIsPending", testOutboxPartsSentAndIsPending},
	{"EndTurnWritesOutbox", testEndTurnWritesOutbox},
	{"EndTurnKeepsEarlierOutboxRow", testEndTurnKeepsEarlierOutboxRow},
	{"UserText", testUserText},
	{"QueuedOrderReplaceRemove", testQueuedOrderReplaceRemove},
	{"QueuedSurvivesReopen", testQueuedSurvivesReopen},
	{"AddQueuedRejectsBadInput", testAddQueuedRejectsBadInput},
	{"PruneKeepsQueued", testPruneKeepsQueued},
	{"TurnStartedRemovesItsQueuedRows", testTurnStartedRemovesItsQueuedRows},
	{"QueuedKeepsTimeout", testQueuedKeepsTimeout},
	{"QueueResumeHeadsTheQueueOnce", testQueueResumeHeadsTheQueueOnce},
	{"PruneSparesRunningTurnsAndPendingOutbox", testPruneSparesRunningTurnsAndPendingOutbox},
	{"StallHistoryPairsEpisodes", testStallHistoryPairsEpisodes},
	{"StallHistoryOfAnInterruptedTurn", testStallHistoryOfAnInterruptedTurn},
	{"StallHistoryAndJournalFilters", testStallHistoryAndJournalFilters},
	{"AgentSessionsRecordReplaceForget", testAgentSessionsRecordReplaceForget},
	{"SessionBusyModeRecordReplaceForget", testSessionBusyModeRecordReplaceForget},
	{"SetAgentSessionRejectsBadInput", testSetAgentSessionRejectsBadInput},
	{"BudgetWarningJournaled", testBudgetWarningJournaled},
}

// T0 is when the test turns start. Times are whole microseconds: every
// backend keeps at least that precision.
var T0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// Quiet is a logger that discards everything.
var Quiet = slog.New(slog.DiscardHandler)

// Flush waits for the recorder's writer.
func Flush(t testing.TB, s store.Recorder) {
	t.Helper()
	if err := s.Flush(context.Background()); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

// Turn builds the events of one run the way the engine publishes them: per
// run sequence numbers, channel and chat, and times offset from T0.
type Turn struct {
	Run, Session, Channel, Chat string
	Seq                         uint64
}

// NewTurn is a Telegram turn in chat 42.
func NewTurn(run, session string) *Turn {
	return &Turn{Run: run, Session: session, Channel: "telegram", Chat: "42"}
}

// Ev returns the next event of the run, at T0+at, with f applied.
func (tr *Turn) Ev(k event.Kind, at time.Duration, f func(*event.Event)) event.Event {
	tr.Seq++
	e := event.Event{Kind: k, RunID: tr.Run, SessionKey: tr.Session, Channel: tr.Channel, ChatRef: tr.Chat,
		Seq: tr.Seq, Time: T0.Add(at)}
	if f != nil {
		f(&e)
	}
	return e
}

// Step is a step that started at T0+startedAt.
func Step(kind, name string, seq uint32, startedAt time.Duration) event.Step {
	return event.Step{Kind: kind, Name: name, Seq: seq, StartedAt: T0.Add(startedAt)}
}

// HandleAll hands evs to the recorder in order.
func HandleAll(s store.Recorder, evs ...event.Event) {
	for _, e := range evs {
		s.Handle(e)
	}
}

// MustHistory is the whole history of session.
func MustHistory(t testing.TB, s store.Reader, session string) []store.Message {
	t.Helper()
	h, err := s.History(context.Background(), session, 0)
	if err != nil {
		t.Fatalf("History(%q): %v", session, err)
	}
	return h
}

// MustTurn is the recorded turn run.
func MustTurn(t testing.TB, s store.Reader, run string) store.Turn {
	t.Helper()
	tr, err := s.Turn(context.Background(), run)
	if err != nil {
		t.Fatalf("Turn(%q): %v", run, err)
	}
	return tr
}

// Msg is a history message without its run id and time, for comparisons.
type Msg struct {
	Role       store.Role
	Text       string
	StopReason event.StopReason
}

// Msgs strips h to Msgs.
func Msgs(h []store.Message) []Msg {
	out := make([]Msg, len(h))
	for i, m := range h {
		out[i] = Msg{m.Role, m.Text, m.StopReason}
	}
	return out
}

// QueuedTexts lists "runID=text" of what Queued returns, in its order.
func QueuedTexts(t *testing.T, s store.Queue) []string {
	t.Helper()
	q, err := s.Queued(context.Background())
	if err != nil {
		t.Fatalf("Queued: %v", err)
	}
	out := make([]string, len(q))
	for i, m := range q {
		out[i] = m.RunID + "=" + m.Text
	}
	return out
}

// EqStrings fails the test unless got equals want.
func EqStrings(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\x00") != strings.Join(want, "\x00") || len(got) != len(want) {
		t.Fatalf("%s = %q, want %q", what, got, want)
	}
}

// KeepDays is a retention policy with every bound set.
var KeepDays = store.Retention{
	History: 30 * 24 * time.Hour, Journal: 7 * 24 * time.Hour, Outbox: 24 * time.Hour, BatchRows: 50,
}

// WriteTurns records n finished turns (question, reply, steps) starting at
// T0+from, one a second, across 10 sessions, and enqueues and delivers
// every tenth reply.
func WriteTurns(t *testing.T, s store.Backend, prefix string, n int, from time.Duration) {
	t.Helper()
	ctx := context.Background()
	reply := strings.Repeat("r", 600)
	for i := range n {
		tr := NewTurn(fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("s%d", i%10))
		at := from + time.Duration(i)*time.Second
		HandleAll(s,
			tr.Ev(event.TurnStarted, at, func(e *event.Event) { e.Text = "question" }),
			tr.Ev(event.StepStarted, at, func(e *event.Event) { e.Step = Step("tool", "shell", 1, at) }),
			tr.Ev(event.StepCompleted, at, func(e *event.Event) { e.Step = Step("tool", "shell", 1, at) }),
			tr.Ev(event.Finished, at, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, reply }))
		if i%10 != 0 {
			continue // a Telegram reply for every tenth (an Enqueue is a durable commit)
		}
		id, err := s.Enqueue(ctx, store.OutboxMessage{Channel: "telegram", ChatRef: "1", RunID: tr.Run, Kind: store.OutboxFinal, Text: reply})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.MarkDelivered(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	Flush(t, s)
}
