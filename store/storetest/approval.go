package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

func init() {
	cases = append(cases,
		testCase{"ApprovalLifecycle", testApprovalLifecycle},
		testCase{"ApprovalsQuery", testApprovalsQuery},
		testCase{"ApprovalsExpireOnRestart", testApprovalsExpireOnRestart},
		testCase{"ApprovalsExpireAfterTakeover", testApprovalsExpireAfterTakeover},
		testCase{"ApprovalSecretsRedacted", testApprovalSecretsRedacted},
		testCase{"ApprovalsPrunedWithTheirTurns", testApprovalsPrunedWithTheirTurns},
	)
}

// Approval is the question id that a runner asks, created 1s after T0,
// expiring a minute after T0: allow once or reject.
func Approval(id string) *event.Approval {
	return &event.Approval{ID: id, Title: "Run a shell command?", Detail: "ls -la /tmp", Tool: "shell",
		Options: []event.ApprovalOption{
			{ID: "allow", Label: "Allow once", Kind: "allow_once"},
			{ID: "deny", Label: "Reject", Kind: "reject_once"},
		},
		CreatedAt: T0.Add(time.Second), ExpiresAt: T0.Add(time.Minute)}
}

// Resolved is a copy of a settled with outcome, option, by and at (T0+at).
func Resolved(a *event.Approval, outcome, option, by string, at time.Duration) *event.Approval {
	r := *a
	r.Outcome, r.OptionID, r.By, r.ResolvedAt = outcome, option, by, T0.Add(at)
	if o, ok := a.Option(option); ok {
		r.OptionKind = o.Kind
	}
	return &r
}

// MustApproval is the recorded approval id; the test fails if there is none.
func MustApproval(t testing.TB, s store.ApprovalStore, id string) store.ApprovalRecord {
	t.Helper()
	a, ok, err := s.Approval(context.Background(), id)
	if err != nil || !ok {
		t.Fatalf("Approval(%q) = %v, %v", id, ok, err)
	}
	return a
}

// ApprovalState is what a test compares of a recorded approval.
type ApprovalState struct {
	Status, OptionID, OptionKind, By string
	ResolvedAt                       time.Time
}

// StateOf is a's ApprovalState.
func StateOf(a store.ApprovalRecord) ApprovalState {
	return ApprovalState{a.Status, a.OptionID, a.OptionKind, a.AnsweredBy, a.ResolvedAt}
}

// testApprovalLifecycle: a question is recorded pending, then with its
// outcome; only the first settlement counts; the end of its turn cancels
// what is still pending. Each case is written in one batch and one event
// per batch: the outcome does not depend on where batches split.
func testApprovalLifecycle(t *testing.T, h *H) {
	ap1, ap2 := Approval("ap_1"), Approval("ap_2")
	ask := func(a *event.Approval) func(*Turn) event.Event {
		return func(tr *Turn) event.Event {
			return tr.Ev(event.ApprovalRequested, time.Second, func(e *event.Event) { e.Approval, e.Message = a, "❓ "+a.Title })
		}
	}
	settle := func(a *event.Approval) func(*Turn) event.Event {
		return func(tr *Turn) event.Event {
			return tr.Ev(event.ApprovalResolved, a.ResolvedAt.Sub(T0), func(e *event.Event) { e.Approval = a })
		}
	}
	end := func(k event.Kind, at time.Duration) func(*Turn) event.Event {
		return func(tr *Turn) event.Event {
			return tr.Ev(k, at, func(e *event.Event) {
				e.StopReason = event.ReasonStop
				if k == event.Aborted {
					e.StopReason, e.Message = event.ReasonUser, "⏹️ Stopped."
				}
			})
		}
	}
	pending := ApprovalState{Status: store.ApprovalPending}
	for _, tc := range []struct {
		name   string
		events []func(*Turn) event.Event
		want   map[string]ApprovalState
	}{
		{"requested is pending", []func(*Turn) event.Event{ask(ap1)},
			map[string]ApprovalState{"ap_1": pending}},
		{"selected", []func(*Turn) event.Event{ask(ap1), settle(Resolved(ap1, event.ApprovalSelected, "allow", "alice", 5*time.Second))},
			map[string]ApprovalState{"ap_1": {event.ApprovalSelected, "allow", "allow_once", "alice", T0.Add(5 * time.Second)}}},
		{"timeout", []func(*Turn) event.Event{ask(ap1), settle(Resolved(ap1, event.ApprovalTimeout, "deny", "", time.Minute))},
			map[string]ApprovalState{"ap_1": {event.ApprovalTimeout, "deny", "reject_once", "", T0.Add(time.Minute)}}},
		{"second resolution ignored", []func(*Turn) event.Event{ask(ap1),
			settle(Resolved(ap1, event.ApprovalSelected, "deny", "bob", 3*time.Second)),
			settle(Resolved(ap1, event.ApprovalTimeout, "deny", "", time.Minute))},
			map[string]ApprovalState{"ap_1": {event.ApprovalSelected, "deny", "reject_once", "bob", T0.Add(3 * time.Second)}}},
		{"repeated request keeps the answer", []func(*Turn) event.Event{ask(ap1),
			settle(Resolved(ap1, event.ApprovalSelected, "allow", "alice", 2*time.Second)), ask(ap1)},
			map[string]ApprovalState{"ap_1": {event.ApprovalSelected, "allow", "allow_once", "alice", T0.Add(2 * time.Second)}}},
		{"finished turn cancels what is pending", []func(*Turn) event.Event{ask(ap1), ask(ap2),
			settle(Resolved(ap1, event.ApprovalSelected, "allow", "alice", 2*time.Second)), end(event.Finished, 9*time.Second)},
			map[string]ApprovalState{
				"ap_1": {event.ApprovalSelected, "allow", "allow_once", "alice", T0.Add(2 * time.Second)},
				"ap_2": {Status: event.ApprovalCancelled, ResolvedAt: T0.Add(9 * time.Second)},
			}},
		{"aborted turn cancels; a later resolution is ignored", []func(*Turn) event.Event{ask(ap1),
			end(event.Aborted, 7*time.Second), settle(Resolved(ap1, event.ApprovalTimeout, "deny", "", time.Minute))},
			map[string]ApprovalState{"ap_1": {Status: event.ApprovalCancelled, ResolvedAt: T0.Add(7 * time.Second)}}},
		{"resolution of an unrecorded request is recorded", []func(*Turn) event.Event{
			settle(Resolved(ap1, event.ApprovalSelected, "allow", "alice", 4*time.Second))},
			map[string]ApprovalState{"ap_1": {event.ApprovalSelected, "allow", "allow_once", "alice", T0.Add(4 * time.Second)}}},
	} {
		for _, batch := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s/batch=%d", tc.name, batch), func(t *testing.T) {
				s := h.Open(t, h.New(t), Config{BatchSize: batch})
				tr := NewTurn("run-1", "s")
				s.Handle(tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "clean up /tmp" }))
				for _, ev := range tc.events {
					s.Handle(ev(tr))
				}
				Flush(t, s)
				if st := s.Stats(); st.Failed != 0 {
					t.Fatalf("%d events failed", st.Failed)
				}
				for id, want := range tc.want {
					a := MustApproval(t, s, id)
					if got := StateOf(a); got != want {
						t.Errorf("%s = %+v, want %+v", id, got, want)
					}
					// What was asked is kept whatever happened to it.
					if a.RunID != "run-1" || a.SessionKey != "s" || a.Channel != "telegram" || a.ChatRef != "42" ||
						a.Title != ap1.Title || a.Detail != ap1.Detail || a.Tool != "shell" ||
						!reflect.DeepEqual(a.Options, ap1.Options) || !a.CreatedAt.Equal(ap1.CreatedAt) || !a.ExpiresAt.Equal(ap1.ExpiresAt) {
						t.Errorf("%s = %+v, want the question as asked (%+v) in run-1's chat", id, a, *ap1)
					}
				}
				all, err := s.Approvals(context.Background(), store.ApprovalQuery{})
				if err != nil || len(all) != len(tc.want) {
					t.Errorf("Approvals() = %d rows, %v; want %d", len(all), err, len(tc.want))
				}
			})
		}
	}

	t.Run("invalid approval events are counted, not written", func(t *testing.T) {
		s := h.Open(t, h.New(t), Config{})
		tr := NewTurn("run-1", "s")
		HandleAll(s,
			tr.Ev(event.ApprovalRequested, 0, nil),
			tr.Ev(event.ApprovalRequested, 0, func(e *event.Event) { e.Approval = &event.Approval{Title: "no id"} }),
			tr.Ev(event.ApprovalResolved, 0, func(e *event.Event) { e.Approval = Resolved(ap1, "maybe", "", "", 0) }),
			tr.Ev(event.ApprovalRequested, 0, func(e *event.Event) { e.Approval = ap2 }))
		Flush(t, s)
		if st := s.Stats(); st.Failed != 3 || st.Written != 1 {
			t.Errorf("stats = %+v, want 3 failed, 1 written", st)
		}
		if _, ok, err := s.Approval(context.Background(), "ap_1"); ok || err != nil {
			t.Errorf("Approval(ap_1) = %v, %v; want none", ok, err)
		}
		MustApproval(t, s, "ap_2")
	})
}

// testApprovalsQuery: Approvals filters by run, session and status, keeps
// the most recent Limit, oldest first; an unknown status is ErrInvalid and
// an unknown id is not found.
func testApprovalsQuery(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{})
	ctx := context.Background()
	a, b := NewTurn("run-a", "s1"), NewTurn("run-b", "s2")
	ask := func(tr *Turn, id string, at time.Duration) event.Event {
		ap := Approval(id)
		ap.CreatedAt = T0.Add(at)
		return tr.Ev(event.ApprovalRequested, at, func(e *event.Event) { e.Approval = ap })
	}
	ap2 := Approval("ap_2")
	ap2.CreatedAt = T0.Add(2 * time.Second)
	HandleAll(s,
		a.Ev(event.TurnStarted, 0, nil), b.Ev(event.TurnStarted, 0, nil),
		ask(a, "ap_1", time.Second), ask(a, "ap_2", 2*time.Second), ask(b, "ap_3", 3*time.Second), ask(a, "ap_4", 4*time.Second),
		a.Ev(event.ApprovalResolved, 5*time.Second, func(e *event.Event) {
			e.Approval = Resolved(ap2, event.ApprovalSelected, "allow", "alice", 5*time.Second)
		}))
	Flush(t, s)
	for _, tc := range []struct {
		name string
		q    store.ApprovalQuery
		want []string
	}{
		{"all", store.ApprovalQuery{}, []string{"ap_1", "ap_2", "ap_3", "ap_4"}},
		{"by run", store.ApprovalQuery{RunID: "run-a"}, []string{"ap_1", "ap_2", "ap_4"}},
		{"by session", store.ApprovalQuery{SessionKey: "s2"}, []string{"ap_3"}},
		{"pending", store.ApprovalQuery{Status: store.ApprovalPending}, []string{"ap_1", "ap_3", "ap_4"}},
		{"pending of a run", store.ApprovalQuery{RunID: "run-a", Status: store.ApprovalPending}, []string{"ap_1", "ap_4"}},
		{"selected", store.ApprovalQuery{Status: event.ApprovalSelected}, []string{"ap_2"}},
		{"most recent two", store.ApprovalQuery{Limit: 2}, []string{"ap_3", "ap_4"}},
		{"unknown run", store.ApprovalQuery{RunID: "nope"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.Approvals(ctx, tc.q)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, a := range got {
				ids = append(ids, a.ID)
			}
			EqStrings(t, "Approvals", ids, tc.want)
		})
	}
	if _, err := s.Approvals(ctx, store.ApprovalQuery{Status: "answered"}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Approvals(status answered) = %v, want ErrInvalid", err)
	}
	if _, ok, err := s.Approval(ctx, "ap_9"); ok || err != nil {
		t.Errorf("Approval(ap_9) = %v, %v; want not found", ok, err)
	}
}

// testApprovalsExpireOnRestart: the previous process stopped with a turn
// waiting on a question, a question whose turn was never recorded and an
// answered one. The start-up recovery (MarkInterrupted, then
// ExpireOrphanApprovals) expires the unanswered ones — expired, not
// answered — and leaves the answer and a running turn's question alone.
func testApprovalsExpireOnRestart(t *testing.T, h *H) {
	ctx := context.Background()
	loc := h.New(t)
	s := h.Open(t, loc, Config{})
	waiting, orphan, answered := NewTurn("run-waiting", "s1"), NewTurn("run-orphan", "s2"), NewTurn("run-answered", "s3")
	apA := Approval("ap_answered")
	HandleAll(s,
		waiting.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "deploy" }),
		waiting.Ev(event.ApprovalRequested, time.Second, func(e *event.Event) { e.Approval = Approval("ap_waiting") }),
		orphan.Ev(event.ApprovalRequested, time.Second, func(e *event.Event) { e.Approval = Approval("ap_orphan") }),
		answered.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "clean" }),
		answered.Ev(event.ApprovalRequested, time.Second, func(e *event.Event) { e.Approval = apA }),
		answered.Ev(event.ApprovalResolved, 2*time.Second, func(e *event.Event) {
			e.Approval = Resolved(apA, event.ApprovalSelected, "allow", "alice", 2*time.Second)
		}))
	Flush(t, s)
	s.Close() // the process stops: two turns running, two questions pending

	s = h.Open(t, loc, Config{})
	before := time.Now().Add(-time.Second)
	// The expiry of a pending question needs its turn ended first.
	if n, err := s.ExpireApprovals(ctx, []string{"run-waiting"}); err != nil || n != 0 {
		t.Errorf("ExpireApprovals of a running turn = %d, %v; want 0", n, err)
	}
	running, err := s.RunningTurns(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range running {
		if ok, err := s.MarkInterrupted(ctx, tr.RunID, "⚠️ restarted"); err != nil || !ok {
			t.Fatalf("MarkInterrupted(%s) = %v, %v", tr.RunID, ok, err)
		}
	}
	if got := StateOf(MustApproval(t, s, "ap_waiting")).Status; got != event.ApprovalExpired {
		t.Errorf("after MarkInterrupted, its question is %s, want expired", got)
	}
	// A turn of this process, running, keeps its question.
	live := NewTurn("run-live", "s4")
	HandleAll(s, live.Ev(event.TurnStarted, 0, nil),
		live.Ev(event.ApprovalRequested, time.Second, func(e *event.Event) { e.Approval = Approval("ap_live") }))
	Flush(t, s)
	if n, err := s.ExpireOrphanApprovals(ctx); err != nil || n != 1 {
		t.Errorf("ExpireOrphanApprovals = %d, %v; want 1 (the orphan)", n, err)
	}
	if n, err := s.ExpireOrphanApprovals(ctx); err != nil || n != 0 {
		t.Errorf("second ExpireOrphanApprovals = %d, %v; want 0", n, err)
	}
	for _, id := range []string{"ap_waiting", "ap_orphan"} {
		a := MustApproval(t, s, id)
		if a.Status != event.ApprovalExpired || a.OptionID != "" || a.OptionKind != "" || a.AnsweredBy != "" ||
			a.ResolvedAt.Before(before) || a.ResolvedAt.After(time.Now().Add(time.Second)) {
			t.Errorf("%s after the restart = %+v, want expired now, unanswered", id, StateOf(a))
		}
	}
	if got, want := StateOf(MustApproval(t, s, "ap_answered")),
		(ApprovalState{event.ApprovalSelected, "allow", "allow_once", "alice", T0.Add(2 * time.Second)}); got != want {
		t.Errorf("the answered question after the restart = %+v, want %+v", got, want)
	}
	if got := MustApproval(t, s, "ap_live").Status; got != store.ApprovalPending {
		t.Errorf("a running turn's question after the sweep is %s, want pending", got)
	}
	// A resolution the old process published too late changes nothing.
	s.Handle(waiting.Ev(event.ApprovalResolved, time.Hour, func(e *event.Event) {
		e.Approval = Resolved(Approval("ap_waiting"), event.ApprovalSelected, "allow", "alice", time.Hour)
	}))
	Flush(t, s)
	if got := MustApproval(t, s, "ap_waiting").Status; got != event.ApprovalExpired {
		t.Errorf("a late resolution made it %s, want expired", got)
	}
	pending, err := s.Approvals(ctx, store.ApprovalQuery{Status: store.ApprovalPending})
	if err != nil || len(pending) != 1 || pending[0].ID != "ap_live" {
		t.Errorf("pending after the restart = %+v, %v; want ap_live only", pending, err)
	}
}

// testApprovalsExpireAfterTakeover: ExpireApprovals ends the pending
// questions of the runs named whose turn is not running (a takeover ends
// the turns in its own transaction, their questions left pending; here a
// turn never recorded stands in for one ended elsewhere), and of no other
// run.
func testApprovalsExpireAfterTakeover(t *testing.T, h *H) {
	ctx := context.Background()
	s := h.Open(t, h.New(t), Config{})
	ask := func(run, id string, started bool) {
		tr := NewTurn(run, "s-"+run)
		if started {
			s.Handle(tr.Ev(event.TurnStarted, 0, nil))
		}
		s.Handle(tr.Ev(event.ApprovalRequested, time.Second, func(e *event.Event) { e.Approval = Approval(id) }))
	}
	ask("run-1", "ap_1", true)
	ask("run-2", "ap_2", true)
	ask("run-x", "ap_x", false)
	ask("run-y", "ap_y", false)
	Flush(t, s)
	if n, err := s.ExpireApprovals(ctx, nil); err != nil || n != 0 {
		t.Errorf("ExpireApprovals(nil) = %d, %v; want 0: no run named", n, err)
	}
	if n, err := s.ExpireApprovals(ctx, []string{"run-1", "run-x"}); err != nil || n != 1 {
		t.Errorf("ExpireApprovals(run-1, run-x) = %d, %v; want 1 (run-x's: run-1 is running)", n, err)
	}
	for id, want := range map[string]string{"ap_1": store.ApprovalPending, "ap_2": store.ApprovalPending,
		"ap_x": event.ApprovalExpired, "ap_y": store.ApprovalPending} {
		if got := MustApproval(t, s, id).Status; got != want {
			t.Errorf("%s = %s, want %s", id, got, want)
		}
	}
}

// testApprovalSecretsRedacted: a credential in an approval's title, detail
// or message (a tool's input) is not stored, in the approval or the
// journal.
func testApprovalSecretsRedacted(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{})
	ctx := context.Background()
	secrets := []string{"sk-live-5f3a9c", "hunter2", "123456:AAF-secretbot", "ghp_tok3n"}
	ap := Approval("ap_1")
	ap.Title = "Use password=hunter2 for the database?"
	ap.Detail = "curl -H 'Authorization: Bearer sk-live-5f3a9c' https://api.telegram.org/bot123456:AAF-secretbot/getMe?token=ghp_tok3n\n" +
		strings.Repeat("x", 10000)
	tr := NewTurn("run-1", "s")
	HandleAll(s, tr.Ev(event.TurnStarted, 0, nil),
		tr.Ev(event.ApprovalRequested, time.Second, func(e *event.Event) {
			e.Approval, e.Message = ap, "❓ "+ap.Title+"\n"+ap.Detail
		}),
		tr.Ev(event.ApprovalResolved, 2*time.Second, func(e *event.Event) {
			e.Approval, e.Message = Resolved(ap, event.ApprovalSelected, "allow", "alice", 2*time.Second), "✅ Allowed: "+ap.Detail
		}))
	Flush(t, s)
	a := MustApproval(t, s, "ap_1")
	j, err := s.Journal(ctx, store.Filter{RunID: "run-1"})
	if err != nil {
		t.Fatal(err)
	}
	kept := []string{a.Title, a.Detail}
	for _, e := range j {
		kept = append(kept, e.Message)
	}
	if len(j) != 3 {
		t.Errorf("journal has %d entries, want 3 (the start and both approval events)", len(j))
	}
	for _, text := range kept {
		for _, sec := range secrets {
			if strings.Contains(text, sec) {
				t.Errorf("stored text holds the secret %q: %.200q", sec, text)
			}
		}
	}
	if !strings.Contains(a.Detail, "curl -H") || !strings.Contains(a.Detail, "<redacted>") || len(a.Detail) > 8<<10+8 {
		t.Errorf("detail = %.120q… (%d bytes), want the command with the credentials redacted, at most 8 KiB", a.Detail, len(a.Detail))
	}
	if a.Status != event.ApprovalSelected {
		t.Errorf("status = %s, want selected", a.Status)
	}
}

// testApprovalsPrunedWithTheirTurns: retention deletes an approval with its
// turn (ended before the history bound), never a running turn's or one of
// a turn it keeps.
func testApprovalsPrunedWithTheirTurns(t *testing.T, h *H) {
	ctx := context.Background()
	s := h.Open(t, h.New(t), Config{Retention: KeepDays})
	old, running, recent := NewTurn("old", "s1"), NewTurn("running", "s2"), NewTurn("recent", "s3")
	recentAt := 100 * 24 * time.Hour
	apRecent := Approval("ap_recent")
	apRecent.CreatedAt = T0.Add(recentAt)
	HandleAll(s,
		old.Ev(event.TurnStarted, 0, nil),
		old.Ev(event.ApprovalRequested, time.Second, func(e *event.Event) { e.Approval = Approval("ap_old") }),
		old.Ev(event.Finished, 2*time.Second, func(e *event.Event) { e.StopReason = event.ReasonStop }),
		running.Ev(event.TurnStarted, 0, nil),
		running.Ev(event.ApprovalRequested, time.Second, func(e *event.Event) { e.Approval = Approval("ap_running") }),
		recent.Ev(event.TurnStarted, recentAt, nil),
		recent.Ev(event.ApprovalRequested, recentAt, func(e *event.Event) { e.Approval = apRecent }),
		recent.Ev(event.Finished, recentAt+time.Second, func(e *event.Event) { e.StopReason = event.ReasonStop }))
	Flush(t, s)
	ps, err := s.Prune(ctx, T0.Add(recentAt+time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if ps.Approvals != 1 {
		t.Errorf("pruned %d approvals, want 1", ps.Approvals)
	}
	var ids []string
	all, err := s.Approvals(ctx, store.ApprovalQuery{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range all {
		ids = append(ids, a.ID)
	}
	slices.Sort(ids)
	EqStrings(t, "approvals after prune", ids, []string{"ap_recent", "ap_running"})
}
