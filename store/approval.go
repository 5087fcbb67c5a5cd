package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/turnguard/turnguard/event"
)

// Approvals are the questions runners ask the person a turn belongs to
// (event.ApprovalRequested) and how they were settled. The recorder keeps
// one row per question:
//   - ApprovalRequested inserts it, status pending (a duplicate of the same
//     id is ignored);
//   - ApprovalResolved sets its outcome (selected, timeout, cancelled,
//     expired), the option chosen, who answered and when, only while it is
//     still pending: a second resolution changes nothing. (One whose request
//     was never recorded is inserted settled.)
//   - the end of its turn (Aborted, Finished) cancels every approval of the
//     run still pending, in the same transaction: the engine publishes no
//     resolution for a question whose turn was stopped while it waited.
//
// At start-up, MarkInterrupted expires the pending approvals of the turn it
// ends, in its transaction, and ExpireOrphanApprovals those of every run
// that is not running; after a cluster's takeover, the gateway expires
// those of the turns it ended (ExpireApprovals: the takeover's own
// transaction, cluster/pgcoord's, does not touch approvals). Retention
// deletes an approval with its turn (Retention.History).
//
// Title and Detail are kept with credentials redacted (RedactSecrets: the
// patterns ErrorText removes from error texts), cut to 8 KiB: Detail
// typically repeats a tool's input (a command line, a request), which can
// carry a token.

// ApprovalPending is the status of an approval nobody has settled yet; the
// other statuses are the outcomes of event.ApprovalResolved
// (event.ApprovalSelected, ApprovalTimeout, ApprovalCancelled,
// ApprovalExpired).
const ApprovalPending = "pending"

// ValidApprovalStatus reports whether s is pending or one of the outcomes.
func ValidApprovalStatus(s string) bool {
	return s == ApprovalPending || validOutcome(s)
}

func validOutcome(s string) bool {
	switch s {
	case event.ApprovalSelected, event.ApprovalTimeout, event.ApprovalCancelled, event.ApprovalExpired:
		return true
	}
	return false
}

// ApprovalRecord is one recorded approval.
type ApprovalRecord struct {
	ID         string                 `json:"id"`
	RunID      string                 `json:"runId"`
	SessionKey string                 `json:"sessionKey"`
	Channel    string                 `json:"channel"`
	ChatRef    string                 `json:"chatRef,omitempty"`
	Title      string                 `json:"title"`
	Detail     string                 `json:"detail,omitempty"` // credentials redacted
	Tool       string                 `json:"tool,omitempty"`
	Options    []event.ApprovalOption `json:"options"`
	// Status is ApprovalPending, then the outcome.
	Status     string    `json:"status"`
	OptionID   string    `json:"optionId,omitempty"`   // the option chosen (a timeout: the first reject option)
	OptionKind string    `json:"optionKind,omitempty"` // its kind
	AnsweredBy string    `json:"answeredBy,omitempty"` // who answered, as the channel names them
	CreatedAt  time.Time `json:"createdAt"`
	ExpiresAt  time.Time `json:"expiresAt,omitzero"`
	ResolvedAt time.Time `json:"resolvedAt,omitzero"` // zero while pending
}

// Pending reports whether nobody has settled the approval yet.
func (a ApprovalRecord) Pending() bool { return a.Status == ApprovalPending }

// ApprovalQuery selects approvals. Empty fields do not filter. When more
// than Limit rows match, the most recent Limit are returned, oldest first.
type ApprovalQuery struct {
	RunID      string
	SessionKey string
	Status     string // ApprovalPending or an outcome; "" any
	Limit      int    // 0: DefaultLimit; capped at MaxLimit
}

// Check returns an error wrapping ErrInvalid for an unknown status.
func (q ApprovalQuery) Check() error {
	if q.Status != "" && !ValidApprovalStatus(q.Status) {
		return fmt.Errorf("approval status %q: %w", q.Status, ErrInvalid)
	}
	return nil
}

// ApprovalStore reads the recorded approvals and ends those whose turn is
// gone. SQLite and the PostgreSQL store implement it (Backend).
type ApprovalStore interface {
	// Approval returns the approval with id; false if there is none.
	Approval(ctx context.Context, id string) (ApprovalRecord, bool, error)
	// Approvals returns the approvals q selects.
	Approvals(ctx context.Context, q ApprovalQuery) ([]ApprovalRecord, error)
	// ExpireApprovals ends as expired (resolved now) the pending approvals
	// of runIDs whose turn is not running (ended, or never recorded): the
	// turns a cluster's takeover ended. It returns how many it ended.
	ExpireApprovals(ctx context.Context, runIDs []string) (int, error)
	// ExpireOrphanApprovals ends as expired every pending approval whose
	// turn is not running: at start-up, after the interrupted turns were
	// ended (MarkInterrupted expires its turn's own, in its transaction),
	// whatever is still pending has no run left to answer it.
	ExpireOrphanApprovals(ctx context.Context) (int, error)
}

// maxApprovalText bounds the title and the detail kept of an approval.
const maxApprovalText = 8 << 10

// approvalText is what the store keeps of an approval's title or detail.
func approvalText(s string) string { return cut(RedactSecrets(s), maxApprovalText) }

// ApprovalOf is the row an ApprovalRequested or ApprovalResolved event
// records at at: status pending or the outcome, the texts redacted, and
// the times of the event where the approval has none.
func ApprovalOf(ev *event.Event, at time.Time) ApprovalRecord {
	a := ev.Approval
	r := ApprovalRecord{
		ID: a.ID, RunID: ev.RunID, SessionKey: ev.SessionKey, Channel: ev.Channel, ChatRef: ev.ChatRef,
		Title: approvalText(a.Title), Detail: approvalText(a.Detail), Tool: a.Tool, Options: a.Options,
		Status: ApprovalPending, CreatedAt: a.CreatedAt, ExpiresAt: a.ExpiresAt,
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = at
	}
	if ev.Kind == event.ApprovalResolved {
		r.Status, r.OptionID, r.OptionKind, r.AnsweredBy, r.ResolvedAt = a.Outcome, a.OptionID, a.OptionKind, a.By, a.ResolvedAt
		if r.ResolvedAt.IsZero() {
			r.ResolvedAt = at
		}
	}
	return r
}

// OptionsJSON is the options column of r: a JSON array, never null.
func (r ApprovalRecord) OptionsJSON() string {
	if len(r.Options) == 0 {
		return "[]"
	}
	b, err := json.Marshal(r.Options)
	if err != nil { // strings only: cannot happen
		return "[]"
	}
	return string(b)
}

// ParseApprovalOptions reads an options column.
func ParseApprovalOptions(s string) ([]event.ApprovalOption, error) {
	var opts []event.ApprovalOption
	if err := json.Unmarshal([]byte(s), &opts); err != nil {
		return nil, fmt.Errorf("approval options: %w", err)
	}
	return opts, nil
}

// validApproval rejects an approval event the store cannot record.
func validApproval(ev *event.Event) error {
	a := ev.Approval
	switch {
	case a == nil:
		return fmt.Errorf("%w: %s without an approval", ErrInvalid, ev.Kind)
	case a.ID == "":
		return fmt.Errorf("%w: %s without an approval id", ErrInvalid, ev.Kind)
	case ev.Kind == event.ApprovalResolved && !validOutcome(a.Outcome):
		return fmt.Errorf("%w: approval %q resolved with outcome %q", ErrInvalid, a.ID, a.Outcome)
	}
	return nil
}
