package admin

import (
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/turnguard/turnguard/gateway/errlog"
)

// ErrorsResponse is the body of GET /api/errors.
type ErrorsResponse struct {
	Now    time.Time       `json:"now"`
	Count  int             `json:"count"`
	Errors []errlog.Record `json:"errors"` // newest first; the engine keeps the last 256
}

// errors lists the recent turn failures: for each, the error id its user
// was shown and the details the user was not (error chain, panic value and
// stack), with the configuration's secrets redacted.
func (h *Handler) errors(w http.ResponseWriter, _ *http.Request) {
	recs := h.opts.Engine.Errors()
	if recs == nil {
		recs = []errlog.Record{}
	}
	writeJSON(w, http.StatusOK, ErrorsResponse{Now: time.Now().UTC(), Count: len(recs), Errors: recs})
}

// errorDetail answers one failure by its error id (case-insensitive).
func (h *Handler) errorDetail(w http.ResponseWriter, r *http.Request) {
	rec, ok := h.opts.Engine.ErrorDetail(chi.URLParam(r, "id"))
	if !ok {
		writeError(w, http.StatusNotFound, "no such error id (the gateway keeps the last 256 failures, until it restarts)")
		return
	}
	writeJSON(w, http.StatusOK, rec)
}
