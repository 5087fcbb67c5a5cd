package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/turnguard/turnguard/event"
)

// StallHistory returns the stall episodes of the turns matching f, computed
// from the journal, ordered by start (the most recent f.Limit of them). An
// episode opens at a turn's first progress notice, or at its abort if no
// notice was open, and is closed by:
//   - Recovered → OutcomeRecovered;
//   - Finished → OutcomeFinished;
//   - Aborted (including an interrupted turn) → OutcomeAborted, extended to
//     OutcomeForceFinalized if a ForceFinalized follows.
//
// A progress notice for a different step than the open episode's closes it
// as recovered and opens a new one. f.SessionKey and f.RunID select turns;
// f.Since and f.Until select episodes by their start, whatever the time of
// the events that end them.
func (s *SQLite) StallHistory(ctx context.Context, f Filter) ([]Episode, error) {
	release, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer release()
	where, args := f.where()
	opener := "kind IN " + StallOpeners
	if where == "" {
		where = " WHERE " + opener
	} else {
		where += " AND " + opener
	}
	rows, err := s.r.QueryContext(ctx, `SELECT run_id, session_key, kind, stop_reason, step_kind, step_name, step_seq, at
		FROM journal
		WHERE kind IN `+StallKinds+`
			AND run_id IN (SELECT run_id FROM journal`+where+`)
		ORDER BY run_id, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("stall history: %w", err)
	}
	defer rows.Close()
	var b EpisodeBuilder
	for rows.Next() {
		var r StallRow
		var kind string
		var seq, at int64
		if err := rows.Scan(&r.RunID, &r.SessionKey, &kind, &r.StopReason, &r.Step.Kind, &r.Step.Name, &seq, &at); err != nil {
			return nil, fmt.Errorf("stall history: %w", err)
		}
		r.Kind, r.Step.Seq, r.At = KindOf(kind), uint32(seq), fromNanos(at)
		b.Add(r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("stall history: %w", err)
	}
	return b.Episodes(f), nil
}

// StallKinds are the journal kinds that open or end stall episodes, as an
// SQL list; StallOpeners those that open one.
const (
	StallKinds   = `('progress', 'recovered', 'aborted', 'force_finalized', 'finished')`
	StallOpeners = `('progress', 'aborted')`
)

// StallRow is one journal entry that matters to stall episodes (of a kind
// in StallKinds).
type StallRow struct {
	RunID, SessionKey string
	Kind              event.Kind
	StopReason        event.StopReason
	Step              event.Step
	At                time.Time
}

// EpisodeBuilder pairs a run's journal rows, fed in order run by run (by
// journal id within a run), into stall episodes (see SQLite.StallHistory).
// The zero value is ready to use.
type EpisodeBuilder struct {
	out     []*Episode
	runID   string
	open    *Episode // an episode opened by progress and not yet ended
	aborted *Episode // the episode the run's abort ended, for ForceFinalized
}

// Add feeds the next row.
func (b *EpisodeBuilder) Add(r StallRow) {
	if r.RunID != b.runID {
		b.runID, b.open, b.aborted = r.RunID, nil, nil
	}
	switch r.Kind {
	case event.Progress:
		if b.open != nil && b.open.Step.Seq != r.Step.Seq {
			b.end(b.open, r, OutcomeRecovered)
		}
		if b.open == nil {
			b.open = b.start(r)
		}
		b.open.Notices++
	case event.Recovered:
		if b.open != nil {
			b.end(b.open, r, OutcomeRecovered)
		}
	case event.Finished:
		if b.open != nil {
			b.end(b.open, r, OutcomeFinished)
		}
	case event.Aborted:
		ep := b.open
		if ep == nil {
			ep = b.start(r)
		}
		b.end(ep, r, OutcomeAborted)
		b.aborted = ep
	case event.ForceFinalized:
		if b.aborted != nil {
			b.aborted.Ended, b.aborted.Outcome = r.At, OutcomeForceFinalized
		}
	}
}

func (b *EpisodeBuilder) start(r StallRow) *Episode {
	ep := &Episode{RunID: r.RunID, SessionKey: r.SessionKey, Step: r.Step, Started: r.At, Outcome: OutcomeOpen}
	b.out = append(b.out, ep)
	return ep
}

func (b *EpisodeBuilder) end(ep *Episode, r StallRow, o Outcome) {
	ep.Ended, ep.Outcome = r.At, o
	if o == OutcomeAborted || o == OutcomeFinished {
		ep.StopReason = r.StopReason
	}
	if ep == b.open {
		b.open = nil
	}
}

// Episodes returns the episodes of the rows fed, those that f selects by
// their start (Since, Until), ordered by start, the most recent f.Limit.
func (b *EpisodeBuilder) Episodes(f Filter) []Episode {
	out := make([]Episode, 0, len(b.out))
	for _, ep := range b.out {
		if (f.Since.IsZero() || !ep.Started.Before(f.Since)) && (f.Until.IsZero() || ep.Started.Before(f.Until)) {
			out = append(out, *ep)
		}
	}
	slices.SortStableFunc(out, func(a, b Episode) int {
		if c := a.Started.Compare(b.Started); c != 0 {
			return c
		}
		return strings.Compare(a.RunID, b.RunID)
	})
	if n := ClampLimit(f.Limit); len(out) > n {
		out = out[len(out)-n:]
	}
	return out
}
