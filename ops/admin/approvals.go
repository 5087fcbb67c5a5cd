package admin

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/store"
)

// Approvals: the questions runners have asked and nobody has answered yet
// (docs/approvals.md), and an operator's answer to one. An operator may
// answer any conversation's question; the person sees "… by operator".

// ApprovalView is an open question of GET /api/approvals.
type ApprovalView struct {
	event.Approval
	RunID       string `json:"runId"`
	SessionKey  string `json:"sessionKey"`
	ExpiresInMs int64  `json:"expiresInMs"` // until it is denied unanswered; negative once passed
	Text        string `json:"text"`        // the question as its person is shown it
	// Elsewhere: asked on another replica (cluster mode; read from the
	// store). An answer through this replica reaches it.
	Elsewhere bool `json:"elsewhere,omitempty"`
}

// ApprovalsResponse is the body of GET /api/approvals.
type ApprovalsResponse struct {
	Now       time.Time      `json:"now"`
	Count     int            `json:"count"`
	Approvals []ApprovalView `json:"approvals"` // oldest first
}

func (h *Handler) approvals(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	open := h.opts.Engine.PendingApprovals("")
	out := ApprovalsResponse{Now: now.UTC(), Approvals: make([]ApprovalView, 0, len(open))}
	local := map[string]bool{}
	for _, a := range open {
		key, runID, ok := h.opts.Engine.ApprovalSession(a.ID)
		if !ok {
			continue // settled meanwhile
		}
		local[a.ID] = true
		out.Approvals = append(out.Approvals, ApprovalView{Approval: a, RunID: runID, SessionKey: key,
			ExpiresInMs: ms(a.ExpiresAt.Sub(now)), Text: messages.ApprovalAsked(&a)})
	}
	// In a cluster the other replicas' open questions are in the store.
	if ar, ok := h.opts.Store.(approvalLister); ok && h.opts.Config.Current().Cluster.Enabled {
		recs, err := ar.Approvals(r.Context(), store.ApprovalQuery{Status: store.ApprovalPending, Limit: store.MaxLimit})
		if err != nil {
			h.log.Warn("cannot list the other replicas' open questions", "err", err)
		}
		for _, rec := range recs {
			if local[rec.ID] || (!rec.ExpiresAt.IsZero() && rec.ExpiresAt.Before(now)) {
				continue
			}
			a := event.Approval{ID: rec.ID, Title: rec.Title, Detail: rec.Detail, Tool: rec.Tool, Options: rec.Options,
				CreatedAt: rec.CreatedAt, ExpiresAt: rec.ExpiresAt}
			out.Approvals = append(out.Approvals, ApprovalView{Approval: a, RunID: rec.RunID, SessionKey: rec.SessionKey,
				ExpiresInMs: ms(a.ExpiresAt.Sub(now)), Text: messages.ApprovalAsked(&a), Elsewhere: true})
		}
		slices.SortStableFunc(out.Approvals, func(x, y ApprovalView) int { return x.CreatedAt.Compare(y.CreatedAt) })
	}
	out.Count = len(out.Approvals)
	writeJSON(w, http.StatusOK, out)
}

// ResolveBody is the body of POST /api/approvals/{id}.
type ResolveBody struct {
	OptionID string `json:"optionId"`
}

// ResolveResponse is the answer of POST /api/approvals/{id}: how the
// question stands. Already: it was settled before (by its person, a
// timeout, its turn's end), and this answer changed nothing.
type ResolveResponse struct {
	Already  bool           `json:"already"`
	Approval event.Approval `json:"approval"`
	Text     string         `json:"text"` // how it was settled, as its person is shown it
}

// maxResolveBody bounds the body of POST /api/approvals/{id}.
const maxResolveBody = 4 << 10

func (h *Handler) resolveApproval(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	if id == "" || len(id) > 128 {
		writeError(w, http.StatusNotFound, "no open question has that id")
		return
	}
	var body ResolveBody
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxResolveBody))
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, `send {"optionId": "<one of the question's option ids>"}: `+jsonWords(err))
		return
	}
	if body.OptionID == "" || len(body.OptionID) > 128 {
		writeError(w, http.StatusBadRequest, `send {"optionId": "<one of the question's option ids>"}`)
		return
	}
	// The question's session routes the answer to the replica that asked
	// it (cluster mode): this replica's engine knows its own questions, the
	// store every replica's.
	key, _, ok := h.opts.Engine.ApprovalSession(id)
	var stored *store.ApprovalRecord
	if ar, isReader := h.opts.Store.(approvalReader); !ok && isReader {
		if rec, found, err := ar.Approval(r.Context(), id); err == nil && found {
			key, stored = rec.SessionKey, &rec
		}
	}
	res, err := h.opts.Engine.Resolve(r.Context(), gateway.ResolveRequest{ApprovalID: id, OptionID: body.OptionID,
		SessionKey: key, By: "operator", Operator: true})
	switch {
	case errors.Is(err, gateway.ErrApprovalNotFound) && stored != nil && !stored.Pending():
		writeError(w, http.StatusNotFound, "that question is no longer open: "+settledWords(stored))
		return
	case errors.Is(err, gateway.ErrApprovalNotFound):
		writeError(w, http.StatusNotFound, "no open question has that id (it never existed, or was settled long ago or before a restart)")
		return
	case errors.Is(err, gateway.ErrApprovalOption):
		writeError(w, http.StatusBadRequest, "optionId "+quote(body.OptionID)+" is not one of the question's options")
		return
	case err != nil:
		h.log.Error("operator answer failed", "approval", id, "err", err)
		writeError(w, http.StatusInternalServerError, "the answer could not be recorded")
		return
	}
	if !res.Already {
		h.log.Warn("operator answered a question", "approval", id, "option", res.Approval.OptionID, "remote", r.RemoteAddr)
	}
	a := res.Approval
	writeJSON(w, http.StatusOK, ResolveResponse{Already: res.Already, Approval: a, Text: messages.ApprovalSettled(&a)})
}

// approvalReader is the store's record of every question (both stores
// implement it); optional, for answers to questions of other replicas and
// for saying how a settled one ended.
type approvalReader interface {
	Approval(ctx context.Context, id string) (store.ApprovalRecord, bool, error)
}

// approvalLister lists stored questions (both stores implement it).
type approvalLister interface {
	Approvals(ctx context.Context, q store.ApprovalQuery) ([]store.ApprovalRecord, error)
}

// settledWords says how a stored question ended, for an operator.
func settledWords(a *store.ApprovalRecord) string {
	switch a.Status {
	case event.ApprovalExpired:
		return "it expired (the gateway running its turn stopped while it waited)"
	case event.ApprovalTimeout:
		return "nobody answered in time, so it was denied"
	case event.ApprovalCancelled:
		return "its request stopped before anyone answered"
	}
	if a.AnsweredBy != "" {
		return "it was answered (" + a.OptionID + ") by " + a.AnsweredBy
	}
	return "it was answered (" + a.OptionID + ")"
}

func quote(s string) string {
	if len(s) > 60 {
		s = s[:60] + "…"
	}
	return `"` + s + `"`
}

func jsonWords(err error) string {
	var mb *http.MaxBytesError
	if errors.As(err, &mb) {
		return "the body is too large"
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}
