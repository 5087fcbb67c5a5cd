package pgcoord

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/internal/testwait"
	"github.com/turnguard/turnguard/store"
)

// 150 concurrent claims of one session from three replicas: exactly one
// starts; the 149 others are told the session is busy, all with the
// winner's run id and replica.
func TestConcurrentClaimsOfOneSessionHaveOneWinner(t *testing.T) {
	url := pgtest.New(t)
	// A long lease: this is about the claims' one winner, not about leases,
	// and on a loaded 2-core machine the storm of 150 claims has starved a
	// 5 s lease's renewal long enough for its replica to fence itself
	// (correctly), failing the claims for the wrong reason.
	const lease = 30 * time.Second
	reps := []*Replica{
		join(t, url, "a", lease, func(o *Options) { o.MaxConns = 50 }),
		join(t, url, "b", lease, func(o *Options) { o.MaxConns = 50 }),
		join(t, url, "c", lease, func(o *Options) { o.MaxConns = 50 }),
	}
	const n = 150
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = reps[i%3].Claim(context.Background(), Claim{RunID: fmt.Sprintf("run-%d", i),
				SessionKey: "telegram:1", Channel: "telegram", ChatRef: "1", Text: fmt.Sprintf("message %d", i)})
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	t.Logf("150 claims took %s", time.Since(began))
	winner := -1
	for i, err := range errs {
		if err == nil {
			if winner >= 0 {
				t.Fatalf("runs %d and %d both claimed the session", winner, i)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatalf("no claim won: first error %v", errs[0])
	}
	wantRun, wantReplica := fmt.Sprintf("run-%d", winner), reps[winner%3].ID()
	for i, err := range errs {
		if i == winner {
			continue
		}
		be, ok := errors.AsType[*BusyError](err)
		if !ok {
			t.Fatalf("claim %d: %v, want *BusyError", i, err)
		}
		if be.HolderRunID != wantRun || be.HolderReplica != wantReplica || be.SessionKey != "telegram:1" {
			t.Fatalf("claim %d: busy with %+v, want holder %s on %s", i, be, wantRun, wantReplica)
		}
	}
	p := db(t, url)
	if n := count(t, p, `SELECT count(*) FROM turns WHERE session_key = 'telegram:1'`); n != 1 {
		t.Errorf("%d turns recorded for the session, want 1", n)
	}
	if n := count(t, p, `SELECT count(*) FROM messages WHERE session_key = 'telegram:1'`); n != 1 {
		t.Errorf("%d messages in the history, want the winner's 1", n)
	}
}

// A run id is answered cluster-wide: running or ended, on any replica. A
// session is free again once its turn's Finish committed, with the reply
// in the history and, for Telegram, in the outbox — once.
func TestClaimIsIdempotentAndTheSessionIsFreeAfterFinish(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	a, b := join(t, url, "a", 5*time.Second), join(t, url, "b", 5*time.Second)
	p := db(t, url)
	first := Claim{RunID: "run-1", SessionKey: "telegram:42", Channel: "telegram", ChatRef: "42", Text: "hi"}
	if err := a.Claim(ctx, first); err != nil {
		t.Fatal(err)
	}
	if de, ok := errors.AsType[*DuplicateError](b.Claim(ctx, first)); !ok || de.State != store.TurnRunning || de.Replica != "a" {
		t.Fatalf("the same run id on b: %v, want *DuplicateError running on a", de)
	}
	second := Claim{RunID: "run-2", SessionKey: "telegram:42", Channel: "telegram", ChatRef: "42", Text: "and now?"}
	if be, ok := errors.AsType[*BusyError](b.Claim(ctx, second)); !ok || be.HolderRunID != "run-1" {
		t.Fatalf("another run on b: %v, want *BusyError held by run-1", be)
	}
	if err := a.Finish(ctx, finished("run-1", "hello")); err != nil {
		t.Fatal(err)
	}
	de, ok := errors.AsType[*DuplicateError](b.Claim(ctx, first))
	if !ok || de.State != store.TurnFinished || de.StopReason != event.ReasonStop {
		t.Fatalf("the ended run id again: %v, want *DuplicateError finished (stop)", de)
	}
	if err := b.Claim(ctx, second); err != nil {
		t.Fatalf("the session after Finish: %v, want it free", err)
	}
	// (The same ending again is a retry after a lost answer:
	// TestFinishRetriedAfterALostAnswerIsDone. Another ending is refused.)
	if err := a.Finish(ctx, event.Event{Kind: event.Aborted, RunID: "run-1", StopReason: event.ReasonUser, Time: time.Now()}); !errors.Is(err, ErrStale) {
		t.Errorf("a second, different Finish: %v, want ErrStale", err)
	}
	if err := a.Finish(ctx, finished("run-9", "?")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Finish of an unknown run: %v, want store.ErrNotFound", err)
	}
	history := texts(t, p, `SELECT role || ':' || text FROM messages WHERE session_key = 'telegram:42' ORDER BY id`)
	if fmt.Sprint(history) != "[user:hi assistant:hello user:and now?]" {
		t.Errorf("history %q", history)
	}
	if n := count(t, p, `SELECT count(*) FROM outbox WHERE run_id = 'run-1' AND kind = 'final' AND text = 'hello'`); n != 1 {
		t.Errorf("%d final rows for run-1, want 1", n)
	}
}

// A replica whose lease expired is taken over; its late Finish writes
// nothing: the turn stays interrupted, with exactly one notice (history,
// and the outbox for Telegram only) and no final reply.
func TestStaleFinishIsRefusedAfterTakeover(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	// A long lease: a's own renewals do not notice the expiry before its
	// Finish, so the database is what refuses it.
	a, b := join(t, url, "a", 30*time.Second), join(t, url, "b", 30*time.Second)
	p := db(t, url)
	for _, c := range []Claim{
		{RunID: "tg", SessionKey: "telegram:7", Channel: "telegram", ChatRef: "7", Text: "long job"},
		{RunID: "ws", SessionKey: "ws:main", Channel: "ws", Text: "another"},
	} {
		if err := a.Claim(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	expire(t, p, a)
	out, err := b.Survey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].Epoch != a.Epoch() || out[0].Replica != "a" || len(out[0].Turns) != 2 {
		t.Fatalf("Survey = %+v, want a's epoch with its 2 turns", out)
	}
	for _, tt := range out[0].Turns {
		if tt.Outboxed != (tt.Channel == "telegram") || tt.Notice != "⚠️ interrupted: "+tt.RunID {
			t.Errorf("taken turn %+v", tt)
		}
	}
	for _, run := range []string{"tg", "ws"} {
		err := a.Finish(ctx, finished(run, "late reply"))
		if !errors.Is(err, ErrStale) {
			t.Fatalf("a's late Finish of %s: %v, want ErrStale", run, err)
		}
	}
	if !errors.Is(a.Err(), ErrLeaseLost) {
		t.Errorf("a.Err() = %v, want ErrLeaseLost: its Finish found its lease gone", a.Err())
	}
	if n := count(t, p, `SELECT count(*) FROM turns WHERE state = 'aborted' AND stop_reason = 'interrupted'`); n != 2 {
		t.Errorf("%d turns interrupted, want 2", n)
	}
	if n := count(t, p, `SELECT count(*) FROM messages WHERE role = 'assistant'`); n != 2 {
		t.Errorf("%d assistant messages, want the 2 notices", n)
	}
	if n := count(t, p, `SELECT count(*) FROM messages WHERE text = 'late reply'`); n != 0 {
		t.Errorf("the late reply is in the history %d times", n)
	}
	if n := count(t, p, `SELECT count(*) FROM outbox WHERE run_id = 'tg' AND kind = 'notice'`); n != 1 {
		t.Errorf("%d notices in the outbox for tg, want 1", n)
	}
	if n := count(t, p, `SELECT count(*) FROM outbox WHERE kind = 'final' OR run_id = 'ws'`); n != 0 {
		t.Errorf("%d outbox rows that must not exist (a final, or one for WebSocket)", n)
	}
	if n := count(t, p, `SELECT count(*) FROM journal WHERE stop_reason = 'interrupted'`); n != 2 {
		t.Errorf("%d journal entries, want 2", n)
	}
	if n := count(t, p, `SELECT count(*) FROM leases WHERE epoch = $1`, a.Epoch()); n != 0 {
		t.Errorf("a's lease is still there")
	}
	if err := b.Claim(ctx, Claim{RunID: "tg-2", SessionKey: "telegram:7", Channel: "telegram", ChatRef: "7"}); err != nil {
		t.Errorf("the taken-over session: %v, want it free", err)
	}
}

// A replica stops renewing (killed): one of three surveying survivors takes
// its turns over within lease + 1 s of its death, and each turn ends with
// exactly one notice.
func TestTakeoverWithinLeasePlusOneSecondExactlyOnce(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	const lease = time.Second
	var seen takeovers
	dead := join(t, url, "dead", lease)
	for i := range 3 {
		join(t, url, fmt.Sprintf("survivor-%d", i), lease, func(o *Options) { o.OnTakeover = seen.add })
	}
	p := db(t, url)
	const turns = 40
	for i := range turns {
		channel := []string{"telegram", "ws"}[i%2]
		if err := dead.Claim(ctx, Claim{RunID: fmt.Sprintf("run-%d", i), SessionKey: fmt.Sprintf("%s:%d", channel, i),
			Channel: channel, ChatRef: fmt.Sprint(i), Text: "work"}); err != nil {
			t.Fatal(err)
		}
	}
	die(dead)
	killed := time.Now()
	testwait.Until(t, lease+2*time.Second, "a survivor takes the dead replica over", func() bool {
		n, _, _ := seen.of(dead.Epoch())
		return n > 0
	})
	n, first, taken := seen.of(dead.Epoch())
	if took := first.Sub(killed); took > lease+time.Second {
		t.Errorf("taken over %s after the death, want ≤ lease + 1 s = %s", took, lease+time.Second)
	} else {
		t.Logf("taken over %s after the death (lease %s)", took.Round(time.Millisecond), lease)
	}
	// The survivors may share the epoch's batches (a small one is one
	// Takeover; another survivor may end nothing and delete the lease),
	// but every turn is ended once and the epoch has one last takeover.
	testwait.Until(t, lease+2*time.Second, "the dead epoch's last takeover", func() bool { return seen.lasts(dead.Epoch()) > 0 })
	n, _, taken = seen.of(dead.Epoch())
	if last := seen.lasts(dead.Epoch()); n > 3 || last != 1 || len(taken) != turns {
		t.Fatalf("%d takeovers (%d last) with %d turns, want at most one per survivor, one last, %d turns", n, last, len(taken), turns)
	}
	// Give the other survivors a few more surveys: still the same.
	time.Sleep(lease / 2) // real time: the survivors' survey loops run on real timers
	if m, _, again := seen.of(dead.Epoch()); m != n || len(again) != turns || seen.lasts(dead.Epoch()) != 1 {
		t.Errorf("%d takeovers with %d turns of the dead epoch after more surveys, want %d with %d", m, len(again), n, turns)
	}
	if n := count(t, p, `SELECT count(*) FROM (SELECT run_id FROM messages WHERE stop_reason = 'interrupted'
		GROUP BY run_id HAVING count(*) = 1) o`); n != turns {
		t.Errorf("%d runs with exactly one interrupted notice in the history, want %d", n, turns)
	}
	if n := count(t, p, `SELECT count(*) FROM outbox WHERE kind = 'notice'`); n != turns/2 {
		t.Errorf("%d notices in the outbox, want %d (the Telegram turns)", n, turns/2)
	}
	if n := count(t, p, `SELECT count(*) FROM turns WHERE state = 'running'`); n != 0 {
		t.Errorf("%d turns still running", n)
	}
}

// Joining again with the same replica id supersedes the earlier epoch: it
// is fenced for good, and its turns are taken over as interrupted.
func TestJoinSupersedesTheEarlierEpoch(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	const lease = 600 * time.Millisecond
	old := join(t, url, "gw-1", lease)
	if err := old.Claim(ctx, Claim{RunID: "r1", SessionKey: "ws:s", Channel: "ws", Text: "hi"}); err != nil {
		t.Fatal(err)
	}
	restarted := join(t, url, "gw-1", lease)
	if restarted.Epoch() == old.Epoch() {
		t.Fatal("a new join got the same epoch")
	}
	if !fencedWithin(old, lease) || !errors.Is(old.Err(), ErrLeaseLost) {
		t.Fatalf("the superseded epoch: Err %v, want fenced with ErrLeaseLost within a lease", old.Err())
	}
	out, err := restarted.Survey(ctx)
	if err != nil || len(out) != 1 || out[0].Epoch != old.Epoch() || len(out[0].Turns) != 1 {
		t.Fatalf("Survey = %+v, %v: want the old epoch's turn", out, err)
	}
	if err := restarted.Claim(ctx, Claim{RunID: "r2", SessionKey: "ws:s", Channel: "ws"}); err != nil {
		t.Errorf("claim after the takeover: %v", err)
	}
	if err := old.Claim(ctx, Claim{RunID: "r3", SessionKey: "ws:t", Channel: "ws"}); !errors.Is(err, ErrFenced) {
		t.Errorf("a claim of the superseded epoch: %v, want ErrFenced", err)
	}
}

// Outbox rows are claimed with SKIP LOCKED: concurrent claimers get
// disjoint rows (of twenty chats); a dead claimer's hold expires; a
// released row is free at once; delivered rows are never claimed.
func TestOutboxClaimsAreDisjointAndExpire(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	a, b := join(t, url, "a", 5*time.Second), join(t, url, "b", 5*time.Second)
	p := db(t, url)
	if _, err := p.Exec(ctx, `INSERT INTO outbox (channel, chat_ref, run_id, kind, text, created_at)
		SELECT 'telegram', i::text, 'run-' || i, 'final', 'reply ' || i, now() FROM generate_series(1, 20) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, `INSERT INTO outbox (channel, chat_ref, run_id, kind, text, created_at, delivered_at)
		VALUES ('telegram', '1', 'sent', 'final', 'done', now(), now())`); err != nil {
		t.Fatal(err)
	}
	var got [2][]store.OutboxMessage
	var errs [2]error
	var wg sync.WaitGroup
	for i, r := range []*Replica{a, b} {
		wg.Go(func() { got[i], errs[i] = r.ClaimOutbox(ctx, "telegram", 15, time.Minute) })
	}
	wg.Wait()
	if err := errors.Join(errs[0], errs[1]); err != nil {
		t.Fatal(err)
	}
	ids := map[int64]string{}
	for i, ms := range got {
		for _, m := range ms {
			if prev, dup := ids[m.ID]; dup {
				t.Fatalf("row %d claimed by %s and %s", m.ID, prev, []string{"a", "b"}[i])
			}
			if m.RunID == "sent" {
				t.Fatal("a delivered row was claimed")
			}
			ids[m.ID] = []string{"a", "b"}[i]
		}
	}
	if len(ids) != 20 {
		t.Fatalf("%d rows claimed between a and b, want all 20", len(ids))
	}
	if more, _ := b.ClaimOutbox(ctx, "telegram", 50, time.Minute); len(more) != len(got[1]) {
		t.Errorf("b claims again: %d rows, want its own %d (held by a: none)", len(more), len(got[1]))
	}
	// a hands back its rows; b dies holding its own, with a short hold.
	if err := a.ReleaseOutbox(ctx, idsOf(got[0])...); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ClaimOutbox(ctx, "telegram", 50, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	die(b)
	mine, err := a.ClaimOutbox(ctx, "telegram", 50, time.Minute)
	if err != nil || len(mine) != 0 {
		t.Fatalf("a claims while b holds everything: %d rows, %v; want none", len(mine), err)
	}
	testwait.Until(t, 2*time.Second, "b's hold expires and a claims its rows", func() bool {
		mine, err = a.ClaimOutbox(ctx, "telegram", 50, time.Minute)
		return err == nil && len(mine) == 20
	})
}

func idsOf(ms []store.OutboxMessage) []int64 {
	out := make([]int64, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// Holder names the running turn of a session and its replica, on every
// replica; an abandoned replica's turn is held until a survivor takes it
// over, and the abandoned replica can then neither finish it nor claim.
func TestHolderAndAbandon(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	a, b := join(t, url, "a", time.Second), join(t, url, "b", time.Second)
	if _, _, ok, err := b.Holder(ctx, "ws:7"); err != nil || ok {
		t.Fatalf("Holder of a session never claimed: ok %v, %v; want free", ok, err)
	}
	if err := a.Claim(ctx, Claim{RunID: "run-1", SessionKey: "ws:7", Channel: "ws", Text: "hi"}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Replica{a, b} {
		if run, rep, ok, err := r.Holder(ctx, "ws:7"); err != nil || !ok || run != "run-1" || rep != "a" {
			t.Fatalf("Holder seen from %s: %q %q %v %v; want run-1 on a", r.ID(), run, rep, ok, err)
		}
	}
	a.Abandon()
	if run, _, ok, _ := b.Holder(ctx, "ws:7"); !ok || run != "run-1" {
		t.Fatalf("an abandoned replica's turn before its lease ran out: %q %v; want still held", run, ok)
	}
	var taken []Takeover
	testwait.NoError(t, 5*time.Second, func() error { // real time: the abandoned lease runs out on the database's clock
		got, err := b.Survey(ctx)
		taken = append(taken, got...)
		if len(taken) == 0 {
			return fmt.Errorf("nothing taken over yet (%v)", err)
		}
		return err
	})
	if len(taken[0].Turns) != 1 || taken[0].Turns[0].RunID != "run-1" || taken[0].Replica != "a" {
		t.Fatalf("takeover %+v; want run-1 of a", taken)
	}
	if _, _, ok, err := b.Holder(ctx, "ws:7"); err != nil || ok {
		t.Errorf("Holder after the takeover: ok %v, %v; want free", ok, err)
	}
	if err := a.Finish(ctx, finished("run-1", "late")); !errors.Is(err, ErrStale) {
		t.Errorf("the abandoned replica's Finish: %v, want ErrStale", err)
	}
	if err := a.Claim(ctx, Claim{RunID: "run-2", SessionKey: "ws:8"}); !errors.Is(err, ErrFenced) {
		t.Errorf("the abandoned replica's Claim: %v, want ErrFenced", err)
	}
	if err := a.Leave(ctx); err != nil {
		t.Errorf("Leave after Abandon: %v", err)
	}
}

// Leave ends the turns still claimed as interrupted and reports them to
// OnLeave (only those: a finished turn is not among them).
func TestLeaveReportsTheTurnsItEnded(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	var left []Takeover
	a := join(t, url, "a", 5*time.Second, func(o *Options) { o.OnLeave = func(t Takeover) { left = append(left, t) } })
	b := join(t, url, "b", 5*time.Second)
	for _, run := range []string{"run-1", "run-2"} {
		if err := a.Claim(ctx, Claim{RunID: run, SessionKey: "ws:" + run, Channel: "ws"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Finish(ctx, finished("run-2", "done")); err != nil {
		t.Fatal(err)
	}
	if err := a.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || len(left[0].Turns) != 1 || left[0].Turns[0].RunID != "run-1" ||
		left[0].Turns[0].Notice != "⚠️ interrupted: run-1" || left[0].Replica != "a" {
		t.Fatalf("OnLeave got %+v; want run-1 of a with its notice", left)
	}
	if _, _, ok, err := b.Holder(ctx, "ws:run-1"); err != nil || ok {
		t.Errorf("Holder after Leave: ok %v, %v; want free", ok, err)
	}
}

// A replica that dies while it holds outbox rows (it was sending them)
// does not keep them for the rest of their hold: the takeover of its lease
// hands them back, so a survivor claims them a lease after the death, not
// a hold after it.
func TestTakeoverReleasesTheDeadReplicasOutboxClaims(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	const lease = time.Second
	var seen takeovers
	dead := join(t, url, "dead", lease)
	survivor := join(t, url, "survivor", lease, func(o *Options) { o.OnTakeover = seen.add })
	if err := dead.Claim(ctx, Claim{RunID: "run-1", SessionKey: "telegram:1", Channel: "telegram", ChatRef: "1", Text: "hi"}); err != nil {
		t.Fatal(err)
	}
	if err := dead.Finish(ctx, finished("run-1", "the reply")); err != nil {
		t.Fatal(err)
	}
	held, err := dead.ClaimOutbox(ctx, "telegram", 10, time.Hour) // it was sending the reply
	if err != nil || len(held) != 1 {
		t.Fatalf("the dead replica's claim: %d rows, %v", len(held), err)
	}
	if got, err := survivor.ClaimOutbox(ctx, "telegram", 10, time.Minute); err != nil || len(got) != 0 {
		t.Fatalf("while the holder lives the row is its own: the survivor claimed %d rows, %v", len(got), err)
	}
	die(dead)
	testwait.Until(t, lease+2*time.Second, "the survivor takes the dead replica over", func() bool {
		n, _, _ := seen.of(dead.Epoch())
		return n == 1
	})
	got, err := survivor.ClaimOutbox(ctx, "telegram", 10, time.Minute)
	if err != nil || len(got) != 1 || got[0].ID != held[0].ID || got[0].Text != "the reply" {
		t.Fatalf("after the takeover the survivor claimed %+v, %v; want the dead replica's reply row", got, err)
	}
}

// A Finish whose answer was lost (a timeout after the commit) is retried by
// the engine: the retry of the same ending is done, not refused — or the
// ending would be recorded and never published (a lost final) — and it
// writes nothing twice. A different ending is still refused.
func TestFinishRetriedAfterALostAnswerIsDone(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	a := join(t, url, "a", 3*time.Second)
	if err := a.Claim(ctx, Claim{RunID: "run-1", SessionKey: "telegram:1", Channel: "telegram", ChatRef: "1", Text: "hi"}); err != nil {
		t.Fatal(err)
	}
	ev := finished("run-1", "the reply")
	if err := a.Finish(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if err := a.Finish(ctx, ev); err != nil {
		t.Fatalf("the same Finish again: %v; want nil (its first answer may have been lost)", err)
	}
	p := db(t, url)
	if n := count(t, p, `SELECT count(*) FROM messages WHERE run_id = 'run-1' AND role = 'assistant'`); n != 1 {
		t.Errorf("%d assistant messages for the run, want 1", n)
	}
	if n := count(t, p, `SELECT count(*) FROM outbox WHERE run_id = 'run-1'`); n != 1 {
		t.Errorf("%d outbox rows for the run, want 1", n)
	}
	other := event.Event{Kind: event.Aborted, RunID: "run-1", StopReason: event.ReasonUser, Time: time.Now()}
	if err := a.Finish(ctx, other); !errors.Is(err, ErrStale) {
		t.Errorf("a different ending after the first: %v; want ErrStale", err)
	}
}

// ClaimAfter says whether the session's previous turn was this epoch's own
// and ended by it: then nobody else published events of the session since
// (cluster/node skips renewing its numbering). Another replica's turn, or a
// turn of this replica taken over by a survivor, is not.
func TestClaimAfterTellsWhoseTheLastTurnWas(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	const lease = time.Second
	var seen takeovers
	a := join(t, url, "a", lease, func(o *Options) { o.OnTakeover = seen.add })
	b := join(t, url, "b", lease)
	claim := func(r *Replica, run string) bool {
		t.Helper()
		mine, err := r.ClaimAfter(ctx, Claim{RunID: run, SessionKey: "ws:after", Channel: "ws", Text: "hi"})
		if err != nil {
			t.Fatalf("claim %s: %v", run, err)
		}
		return mine
	}
	if claim(a, "run-1") {
		t.Error("the session's first turn: previous turn mine, want not (there is none)")
	}
	if err := a.Finish(ctx, finished("run-1", "one")); err != nil {
		t.Fatal(err)
	}
	if !claim(a, "run-2") {
		t.Error("after a's own ended turn: want previous turn mine")
	}
	if err := a.Finish(ctx, finished("run-2", "two")); err != nil {
		t.Fatal(err)
	}
	if claim(b, "run-3") {
		t.Error("b after a's turn: want not mine")
	}
	die(b)
	testwait.Until(t, lease+2*time.Second, "a takes b over", func() bool { n, _, _ := seen.of(b.Epoch()); return n == 1 })
	if claim(a, "run-4") {
		t.Error("a after b's turn, taken over: want not mine")
	}
}

// A claim that committed but whose answer was lost (a client's disconnect
// cancelled the request mid-COMMIT) is read back (issue 20, defect 5): it is
// this replica's, so Claim says so and the turn runs and ends. Answered as
// an error, the turn's row stayed running under the live epoch with
// nothing running it: the run id answered "in flight" and the session was
// busy for every new message until the replica restarted.
func TestAmbiguousClaimIsReadBack(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	a := join(t, url, "a", 5*time.Second)
	testHookClaimCommitted = func() error { return context.Canceled } // the commit's answer never came
	first := Claim{RunID: "run-1", SessionKey: "telegram:7", Channel: "telegram", ChatRef: "7", Text: "hi"}
	err := a.Claim(ctx, first)
	testHookClaimCommitted = nil
	if err != nil {
		t.Fatalf("a claim that committed, answer lost: %v; want nil (it is this replica's)", err)
	}
	if err := a.Finish(ctx, finished("run-1", "hello")); err != nil {
		t.Fatalf("Finish of the read-back claim: %v", err)
	}
	if err := a.Claim(ctx, Claim{RunID: "run-2", SessionKey: "telegram:7", Channel: "telegram", ChatRef: "7", Text: "next"}); err != nil {
		t.Fatalf("the next message of the session: %v, want it free", err)
	}
}

// A Finish whose answer was lost, retried after the replica was fenced
// (issue 20, suspected: "Finish's retry crossing a fence"): the ending was
// committed, so the retry is done, not refused — refused, it was recorded
// but never published, and no survivor ends a turn that is not running: its
// watchers never saw the end. An ending that did not commit is still refused.
func TestFinishRetriedAcrossAFenceIsDone(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	a := join(t, url, "a", 3*time.Second)
	for _, run := range []string{"run-1", "run-2"} {
		if err := a.Claim(ctx, Claim{RunID: run, SessionKey: "ws:" + run, Channel: "ws", Text: "hi"}); err != nil {
			t.Fatal(err)
		}
	}
	ev := finished("run-1", "the reply")
	if err := a.Finish(ctx, ev); err != nil {
		t.Fatal(err)
	}
	expire(t, db(t, url), a)
	if !fencedWithin(a, 10*time.Second) {
		t.Fatal("not fenced after its lease expired")
	}
	if err := a.Finish(ctx, ev); err != nil {
		t.Fatalf("the committed Finish retried after the fence: %v; want nil", err)
	}
	if err := a.Finish(ctx, finished("run-2", "late")); !errors.Is(err, ErrStale) {
		t.Fatalf("a Finish first tried after the fence: %v; want ErrStale", err)
	}
}

// A dead replica's thousands of turns are taken over in batches of at most
// takeoverBatch, each committed and handed to OnTakeover on its own (More
// on all but the last, which deletes the lease, committed after all the
// others), while three survivors survey: every turn is ended exactly once,
// in exactly one batch.
func TestLargeTakeoverCommitsInBatchesExactlyOnce(t *testing.T) {
	url := pgtest.New(t)
	const lease = time.Second
	const turns = 2*takeoverBatch + 500
	var seen takeovers
	dead := join(t, url, "dead", lease)
	for i := range 3 {
		join(t, url, fmt.Sprintf("survivor-%d", i), lease, func(o *Options) { o.OnTakeover = seen.add })
	}
	p := db(t, url)
	killWithTurns(t, p, dead, turns)
	batchesOf := func() []Takeover {
		seen.mu.Lock()
		defer seen.mu.Unlock()
		var batches []Takeover
		for _, tk := range seen.all {
			if tk.Epoch == dead.Epoch() {
				batches = append(batches, tk)
			}
		}
		return batches
	}
	testwait.Until(t, lease+30*time.Second, "the survivors take every turn over and delete the lease", func() bool {
		_, _, taken := seen.of(dead.Epoch())
		return len(taken) >= turns && slices.ContainsFunc(batchesOf(), func(tk Takeover) bool { return !tk.More })
	})
	batches := batchesOf()
	if len(batches) < 3 {
		t.Fatalf("%d takeovers of %d turns, want batches of at most %d", len(batches), turns, takeoverBatch)
	}
	// The survivors' batches run at once and each survivor hands its own
	// on, so they arrive in no set order; the last (More false, the lease
	// deleted) is one, committed after every other (it waited for them:
	// the latest on the database's clock).
	runs := map[string]bool{}
	last := slices.IndexFunc(batches, func(tk Takeover) bool { return !tk.More })
	for i, tk := range batches {
		if len(tk.Turns) > takeoverBatch {
			t.Errorf("batch %d ended %d turns, want at most %d", i, len(tk.Turns), takeoverBatch)
		}
		if !tk.More && i != last {
			t.Errorf("batches %d and %d of %d both last (More false)", last+1, i+1, len(batches))
		}
		if i != last && tk.Overdue >= batches[last].Overdue {
			t.Errorf("batch %d (overdue %v) committed after the last (%v)", i+1, tk.Overdue, batches[last].Overdue)
		}
		for _, tt := range tk.Turns {
			if runs[tt.RunID] {
				t.Errorf("%s taken over twice", tt.RunID)
			}
			runs[tt.RunID] = true
		}
	}
	if len(runs) != turns {
		t.Errorf("%d turns taken over, want %d", len(runs), turns)
	}
	if n := count(t, p, `SELECT count(*) FROM (SELECT run_id FROM messages WHERE stop_reason = 'interrupted'
		GROUP BY run_id HAVING count(*) = 1) o`); n != turns {
		t.Errorf("%d runs with exactly one interrupted notice in the history, want %d", n, turns)
	}
	if n := count(t, p, `SELECT count(*) FROM journal WHERE stop_reason = 'interrupted'`); n != turns {
		t.Errorf("%d interrupted endings journaled, want %d", n, turns)
	}
	if n := count(t, p, `SELECT count(*) FROM turns WHERE state = 'running'`); n != 0 {
		t.Errorf("%d turns still running", n)
	}
	if n := count(t, p, `SELECT count(*) FROM leases WHERE epoch = $1`, dead.Epoch()); n != 0 {
		t.Errorf("the dead epoch's lease is still there")
	}
}

// TestSurvivorsEndBatchesOfOneEpochAtOnce: while another survivor's batch
// holds a dead epoch's lease (FOR SHARE) and some of its turns, a survey
// does not skip the epoch until the next survey: it ends a batch of the
// other turns at once, leaves the lease to the batch still running (the
// one that ends the last turns deletes it) and never ends a turn that
// batch holds; once that batch committed, the next survey deletes the
// lease. Every turn is ended once.
func TestSurvivorsEndBatchesOfOneEpochAtOnce(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	const held, turns = 300, takeoverBatch + 300
	dead, b := join(t, url, "dead", 30*time.Second), join(t, url, "b", 30*time.Second)
	p := db(t, url)
	killWithTurns(t, p, dead, turns)
	expire(t, p, dead)

	// The other survivor's batch, as takeOverNext's transaction holds it.
	other, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	if _, err := other.Exec(ctx, `SELECT FROM leases WHERE epoch = $1 FOR SHARE`, dead.Epoch()); err != nil {
		t.Fatal(err)
	}
	rows, err := other.Query(ctx, `SELECT run_id FROM turns WHERE owner_epoch = $1 AND state = 'running'
		ORDER BY run_id LIMIT $2 FOR UPDATE`, dead.Epoch(), held)
	if err != nil {
		t.Fatal(err)
	}
	heldRuns, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}

	out, err := b.Survey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].Epoch != dead.Epoch() || len(out[0].Turns) != takeoverBatch || !out[0].More {
		t.Fatalf("Survey beside another batch = %d takeovers (%+v); want one batch of %d, More set", len(out), out, takeoverBatch)
	}
	isHeld := map[string]bool{}
	for _, run := range heldRuns {
		isHeld[run] = true
	}
	for _, tt := range out[0].Turns {
		if isHeld[tt.RunID] {
			t.Fatalf("ended %s, which the other batch holds", tt.RunID)
		}
	}
	if n := count(t, p, `SELECT count(*) FROM leases WHERE epoch = $1`, dead.Epoch()); n != 1 {
		t.Fatalf("the lease was deleted under the other batch")
	}

	// The other batch ends its turns and commits; the next survey deletes
	// the lease, with nothing left to end.
	if _, err := other.Exec(ctx, `UPDATE turns SET state = 'aborted', stop_reason = 'interrupted', ended_at = now()
		WHERE run_id = ANY($1)`, heldRuns); err != nil {
		t.Fatal(err)
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	out, err = b.Survey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].Epoch != dead.Epoch() || len(out[0].Turns) != 0 || out[0].More {
		t.Fatalf("Survey after the other batch = %+v; want the last, with no turn left", out)
	}
	if n := count(t, p, `SELECT count(*) FROM leases WHERE epoch = $1`, dead.Epoch()); n != 0 {
		t.Errorf("the dead epoch's lease is still there")
	}
	if n := count(t, p, `SELECT count(*) FROM turns WHERE state = 'running'`); n != 0 {
		t.Errorf("%d turns still running", n)
	}
	if n := count(t, p, `SELECT count(*) FROM journal WHERE stop_reason = 'interrupted'`); n != takeoverBatch {
		t.Errorf("%d interrupted endings journaled by b, want %d", n, takeoverBatch)
	}
}
