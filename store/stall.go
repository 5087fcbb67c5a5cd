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
	opener := "kind IN ('progress', 'aborted')"
	if where == "" {
		where = " WHERE " + opener
	} else {
		where += " AND " + opener
	}
	rows, err := s.r.QueryContext(ctx, `SELECT run_id, session_key, kind, stop_reason, step_kind, step_name, step_seq, at
		FROM journal
		WHERE kind IN ('progress', 'recovered', 'aborted', 'force_finalized', 'finished')
			AND run_id IN (SELECT run_id FROM journal`+where+`)
		ORDER BY run_id, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("stall history: %w", err)
	}
	defer rows.Close()
	var b episodeBuilder
	for rows.Next() {
		var r stallRow
		var kind string
		var seq, at int64
		if err := rows.Scan(&r.runID, &r.sessionKey, &kind, &r.reason, &r.step.Kind, &r.step.Name, &seq, &at); err != nil {
			return nil, fmt.Errorf("stall history: %w", err)
		}
		r.kind, r.step.Seq, r.at = kindByName[kind], uint32(seq), fromNanos(at)
		b.add(r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("stall history: %w", err)
	}
	out := slices.DeleteFunc(b.episodes(), func(e Episode) bool {
		return (!f.Since.IsZero() && e.Started.Before(f.Since)) || (!f.Until.IsZero() && !e.Started.Before(f.Until))
	})
	slices.SortStableFunc(out, func(a, b Episode) int {
		if c := a.Started.Compare(b.Started); c != 0 {
			return c
		}
		return strings.Compare(a.RunID, b.RunID)
	})
	if n := clampLimit(f.Limit); len(out) > n {
		out = out[len(out)-n:]
	}
	return out, nil
}

// stallRow is one journal entry that matters to stall episodes.
type stallRow struct {
	runID, sessionKey string
	kind              event.Kind
	reason            event.StopReason
	step              event.Step
	at                time.Time
}

// episodeBuilder pairs a run's journal rows, fed in order run by run, into
// episodes.
type episodeBuilder struct {
	out     []*Episode
	runID   string
	open    *Episode // an episode opened by progress and not yet ended
	aborted *Episode // the episode the run's abort ended, for ForceFinalized
}

func (b *episodeBuilder) add(r stallRow) {
	if r.runID != b.runID {
		b.runID, b.open, b.aborted = r.runID, nil, nil
	}
	switch r.kind {
	case event.Progress:
		if b.open != nil && b.open.Step.Seq != r.step.Seq {
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
			b.aborted.Ended, b.aborted.Outcome = r.at, OutcomeForceFinalized
		}
	}
}

func (b *episodeBuilder) start(r stallRow) *Episode {
	ep := &Episode{RunID: r.runID, SessionKey: r.sessionKey, Step: r.step, Started: r.at, Outcome: OutcomeOpen}
	b.out = append(b.out, ep)
	return ep
}

func (b *episodeBuilder) end(ep *Episode, r stallRow, o Outcome) {
	ep.Ended, ep.Outcome = r.at, o
	if o == OutcomeAborted || o == OutcomeFinished {
		ep.StopReason = r.reason
	}
	if ep == b.open {
		b.open = nil
	}
}

func (b *episodeBuilder) episodes() []Episode {
	out := make([]Episode, len(b.out))
	for i, ep := range b.out {
		out[i] = *ep
	}
	return out
}
