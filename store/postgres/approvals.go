package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// approvalColumns are the approvals table's columns, in the order of the
// recorder's statements.
const approvalColumns = `id, run_id, session_key, channel, chat_ref, title, detail, tool, options, status,
	option_id, option_kind, answered_by, created_at, expires_at, resolved_at`

// selectApproval reads approvalColumns in scanApproval's order.
const selectApproval = `SELECT id, run_id, session_key, channel, chat_ref, title, detail, tool, options::text, status,
	option_id, option_kind, answered_by, created_at, expires_at, resolved_at FROM approvals`

func scanApproval(row pgx.Row) (store.ApprovalRecord, error) {
	var a store.ApprovalRecord
	var options string
	var expires, resolved *time.Time
	if err := row.Scan(&a.ID, &a.RunID, &a.SessionKey, &a.Channel, &a.ChatRef, &a.Title, &a.Detail, &a.Tool, &options,
		&a.Status, &a.OptionID, &a.OptionKind, &a.AnsweredBy, &a.CreatedAt, &expires, &resolved); err != nil {
		return store.ApprovalRecord{}, err
	}
	var err error
	if a.Options, err = store.ParseApprovalOptions(options); err != nil {
		return store.ApprovalRecord{}, err
	}
	a.CreatedAt, a.ExpiresAt, a.ResolvedAt = a.CreatedAt.UTC(), timeOf(expires), timeOf(resolved)
	return a, nil
}

// Approval returns the recorded approval with id; false if there is none.
// One still in the recorder's queue is not seen; see Flush.
func (s *Store) Approval(ctx context.Context, id string) (store.ApprovalRecord, bool, error) {
	if err := s.live(); err != nil {
		return store.ApprovalRecord{}, false, err
	}
	a, err := scanApproval(s.pool.QueryRow(ctx, selectApproval+` WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ApprovalRecord{}, false, nil
	}
	if err != nil {
		return store.ApprovalRecord{}, false, fmt.Errorf("approval %q: %w", id, err)
	}
	return a, true, nil
}

// Approvals returns the approvals q selects: the most recent q.Limit,
// oldest first. An unknown status is store.ErrInvalid.
func (s *Store) Approvals(ctx context.Context, q store.ApprovalQuery) ([]store.ApprovalRecord, error) {
	if err := q.Check(); err != nil {
		return nil, err
	}
	if err := s.live(); err != nil {
		return nil, err
	}
	var conds []string
	var args []any
	for _, f := range []struct{ col, v string }{{"run_id", q.RunID}, {"session_key", q.SessionKey}, {"status", q.Status}} {
		if f.v != "" {
			args = append(args, f.v)
			conds = append(conds, f.col+" = $"+strconv.Itoa(len(args)))
		}
	}
	where := ""
	if len(conds) > 0 {
		where = " WHERE " + strings.Join(conds, " AND ")
	}
	args = append(args, store.ClampLimit(q.Limit))
	rows, err := s.pool.Query(ctx, selectApproval+where+` ORDER BY created_at DESC, id DESC LIMIT $`+strconv.Itoa(len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("approvals: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.ApprovalRecord, error) { return scanApproval(row) })
	if err != nil {
		return nil, fmt.Errorf("approvals: %w", err)
	}
	slices.Reverse(out)
	return out, nil
}

// expireApprovals expires the pending approvals whose turn is not running
// (a claimed turn of a live replica is running: it is left alone); $1 is
// the time, $2 the run ids (NULL: every run).
const expireApprovals = `UPDATE approvals SET status = 'expired', resolved_at = $1
	WHERE status = 'pending' AND ($2::text[] IS NULL OR run_id = ANY($2))
	AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.run_id = approvals.run_id AND t.state = 'running')`

// ExpireApprovals ends as expired the pending approvals of runIDs whose
// turn is not running (see store.ApprovalStore): the turns a cluster's
// takeover ended. None for no run ids.
func (s *Store) ExpireApprovals(ctx context.Context, runIDs []string) (int, error) {
	if len(runIDs) == 0 {
		return 0, nil
	}
	return s.expire(ctx, runIDs)
}

// ExpireOrphanApprovals ends as expired every pending approval whose turn
// is not running (see store.ApprovalStore).
func (s *Store) ExpireOrphanApprovals(ctx context.Context) (int, error) {
	return s.expire(ctx, nil)
}

func (s *Store) expire(ctx context.Context, runIDs []string) (int, error) {
	if err := s.live(); err != nil {
		return 0, err
	}
	var n int64
	err := RetryConflicts(ctx, func() error {
		return s.inTx(ctx, false, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, expireApprovals, time.Now(), runIDs)
			n = tag.RowsAffected()
			return err
		})
	})
	if err != nil {
		return 0, fmt.Errorf("expire approvals: %w", err)
	}
	return int(n), nil
}

// TurnDetails returns the steps and settled approvals of the finished
// turns runIDs (see store.TurnDetails).
func (s *Store) TurnDetails(ctx context.Context, runIDs []string) (map[string]event.TurnDetail, error) {
	ids := store.TurnDetailRuns(runIDs)
	if len(ids) == 0 {
		return map[string]event.TurnDetail{}, nil
	}
	if err := s.live(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT run_id, kind, step_kind, step_name, step_seq, elapsed_ns FROM journal
		WHERE run_id = ANY($1) AND kind IN ('step_started', 'step_completed') ORDER BY id LIMIT $2`, ids, store.MaxLimit)
	if err != nil {
		return nil, fmt.Errorf("turn steps: %w", err)
	}
	entries, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.JournalEntry, error) {
		var e store.JournalEntry
		var stepSeq, elapsed int64
		err := row.Scan(&e.RunID, &e.KindName, &e.Step.Kind, &e.Step.Name, &stepSeq, &elapsed)
		e.Kind, e.Step.Seq, e.Elapsed = store.KindOf(e.KindName), uint32(stepSeq), time.Duration(elapsed)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("turn steps: %w", err)
	}
	rows, err = s.pool.Query(ctx, selectApproval+` WHERE run_id = ANY($1) AND status <> 'pending'
		ORDER BY created_at, id LIMIT $2`, ids, store.MaxLimit)
	if err != nil {
		return nil, fmt.Errorf("turn approvals: %w", err)
	}
	approvals, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.ApprovalRecord, error) { return scanApproval(row) })
	if err != nil {
		return nil, fmt.Errorf("turn approvals: %w", err)
	}
	return store.AssembleTurnDetails(entries, approvals), nil
}
