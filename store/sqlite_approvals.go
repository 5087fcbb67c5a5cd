package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/turnguard/turnguard/event"
)

// approvalColumns are the approvals table's columns, in the order of the
// recorder's statements and of scanApproval.
const approvalColumns = `id, run_id, session_key, channel, chat_ref, title, detail, tool, options, status,
	option_id, option_kind, answered_by, created_at, expires_at, resolved_at`

func scanApproval(sc scanner) (ApprovalRecord, error) {
	var a ApprovalRecord
	var options string
	var created int64
	var expires, resolved sql.NullInt64
	if err := sc.Scan(&a.ID, &a.RunID, &a.SessionKey, &a.Channel, &a.ChatRef, &a.Title, &a.Detail, &a.Tool, &options,
		&a.Status, &a.OptionID, &a.OptionKind, &a.AnsweredBy, &created, &expires, &resolved); err != nil {
		return ApprovalRecord{}, err
	}
	var err error
	if a.Options, err = ParseApprovalOptions(options); err != nil {
		return ApprovalRecord{}, err
	}
	a.CreatedAt, a.ExpiresAt, a.ResolvedAt = fromNanos(created), fromNullNanos(expires), fromNullNanos(resolved)
	return a, nil
}

// Approval returns the recorded approval with id; false if there is none.
// One still in the recorder's queue is not seen; see Flush.
func (s *SQLite) Approval(ctx context.Context, id string) (ApprovalRecord, bool, error) {
	release, err := s.acquire()
	if err != nil {
		return ApprovalRecord{}, false, err
	}
	defer release()
	a, err := scanApproval(s.r.QueryRowContext(ctx, `SELECT `+approvalColumns+` FROM approvals WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return ApprovalRecord{}, false, nil
	}
	if err != nil {
		return ApprovalRecord{}, false, fmt.Errorf("approval %q: %w", id, err)
	}
	return a, true, nil
}

// Approvals returns the approvals q selects: the most recent q.Limit,
// oldest first. An unknown status is ErrInvalid.
func (s *SQLite) Approvals(ctx context.Context, q ApprovalQuery) ([]ApprovalRecord, error) {
	if err := q.Check(); err != nil {
		return nil, err
	}
	release, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer release()
	var conds []string
	var args []any
	for _, f := range []struct{ col, v string }{{"run_id", q.RunID}, {"session_key", q.SessionKey}, {"status", q.Status}} {
		if f.v != "" {
			conds, args = append(conds, f.col+" = ?"), append(args, f.v)
		}
	}
	where := ""
	if len(conds) > 0 {
		where = " WHERE " + strings.Join(conds, " AND ")
	}
	rows, err := s.r.QueryContext(ctx, `SELECT `+approvalColumns+` FROM approvals`+where+`
		ORDER BY created_at DESC, id DESC LIMIT ?`, append(args, ClampLimit(q.Limit))...)
	if err != nil {
		return nil, fmt.Errorf("approvals: %w", err)
	}
	defer rows.Close()
	var out []ApprovalRecord
	for rows.Next() {
		a, err := scanApproval(rows)
		if err != nil {
			return nil, fmt.Errorf("approvals: %w", err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("approvals: %w", err)
	}
	slices.Reverse(out)
	return out, nil
}

// expireApprovals is the statement that expires pending approvals whose
// turn is not running; ?1 is the time, the caller appends a run filter.
const expireApprovals = `UPDATE approvals SET status = 'expired', resolved_at = ?1
	WHERE status = 'pending'
	AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.run_id = approvals.run_id AND t.state = 'running')`

// ExpireApprovals ends as expired the pending approvals of runIDs whose
// turn is not running (see ApprovalStore); none for no run ids.
func (s *SQLite) ExpireApprovals(ctx context.Context, runIDs []string) (int, error) {
	if len(runIDs) == 0 {
		return 0, nil
	}
	return s.expire(ctx, runIDs)
}

// ExpireOrphanApprovals ends as expired every pending approval whose turn
// is not running (see ApprovalStore).
func (s *SQLite) ExpireOrphanApprovals(ctx context.Context) (int, error) {
	return s.expire(ctx, nil)
}

// expire runs expireApprovals for runIDs (nil: every run), in batches of
// maxRemoveBatch run ids.
func (s *SQLite) expire(ctx context.Context, runIDs []string) (int, error) {
	release, err := s.acquire()
	if err != nil {
		return 0, err
	}
	defer release()
	now := nanos(time.Now())
	var n int64
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		if runIDs == nil {
			res, err := tx.ExecContext(ctx, expireApprovals, now)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		}
		for ids := runIDs; len(ids) > 0; {
			k := min(len(ids), maxRemoveBatch)
			args := make([]any, 0, k+1)
			args = append(args, now)
			for _, id := range ids[:k] {
				args = append(args, id)
			}
			res, err := tx.ExecContext(ctx, expireApprovals+` AND run_id IN (?`+strings.Repeat(`, ?`, k-1)+`)`, args...)
			if err != nil {
				return err
			}
			m, err := res.RowsAffected()
			if err != nil {
				return err
			}
			n += m
			ids = ids[k:]
		}
		return nil
	})
	s.rec.NoteWrite(err)
	if err != nil {
		return 0, fmt.Errorf("expire approvals: %w", err)
	}
	return int(n), nil
}

// TurnDetails returns the steps and settled approvals of the finished
// turns runIDs (see store.TurnDetails). Events still in the recorder's
// queue are not seen; see Flush.
func (s *SQLite) TurnDetails(ctx context.Context, runIDs []string) (map[string]event.TurnDetail, error) {
	runIDs = TurnDetailRuns(runIDs)
	if len(runIDs) == 0 {
		return map[string]event.TurnDetail{}, nil
	}
	release, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer release()
	in := strings.TrimSuffix(strings.Repeat("?, ", len(runIDs)), ", ")
	args := make([]any, 0, len(runIDs)+1)
	for _, id := range runIDs {
		args = append(args, id)
	}
	rows, err := s.r.QueryContext(ctx, `SELECT run_id, kind, step_kind, step_name, step_seq, elapsed_ns FROM journal
		WHERE run_id IN (`+in+`) AND kind IN ('step_started', 'step_completed') ORDER BY id LIMIT ?`,
		append(args, MaxLimit)...)
	if err != nil {
		return nil, fmt.Errorf("turn steps: %w", err)
	}
	defer rows.Close()
	var entries []JournalEntry
	for rows.Next() {
		var e JournalEntry
		var stepSeq, elapsed int64
		if err := rows.Scan(&e.RunID, &e.KindName, &e.Step.Kind, &e.Step.Name, &stepSeq, &elapsed); err != nil {
			return nil, fmt.Errorf("turn steps: %w", err)
		}
		e.Kind, e.Step.Seq, e.Elapsed = KindOf(e.KindName), uint32(stepSeq), time.Duration(elapsed)
		entries = append(entries, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("turn steps: %w", err)
	}
	arows, err := s.r.QueryContext(ctx, `SELECT `+approvalColumns+` FROM approvals
		WHERE run_id IN (`+in+`) AND status <> 'pending' ORDER BY created_at, id LIMIT ?`,
		append(args, MaxLimit)...)
	if err != nil {
		return nil, fmt.Errorf("turn approvals: %w", err)
	}
	defer arows.Close()
	var approvals []ApprovalRecord
	for arows.Next() {
		a, err := scanApproval(arows)
		if err != nil {
			return nil, fmt.Errorf("turn approvals: %w", err)
		}
		approvals = append(approvals, a)
	}
	if err := arows.Err(); err != nil {
		return nil, fmt.Errorf("turn approvals: %w", err)
	}
	return AssembleTurnDetails(entries, approvals), nil
}
