package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// maxModes bounds the modes kept per session, maxModeID a mode's id and
// name.
const (
	maxModes  = 50
	maxModeID = 64
)

// Mode is one of an agent session's modes (e.g. "ask", "code").
type Mode struct {
	ID, Name, Description string
}

// Modes is an agent session's modes: the current one's id and those
// available (none: the agent has no modes).
type Modes struct {
	Current   string
	Available []Mode
}

// Errors of SetMode.
var (
	// ErrNoSession: no agent session serves the conversation yet (nothing
	// was sent to the agent since it started or since /new).
	ErrNoSession = errors.New("acp: no agent session for the conversation")
	// ErrNoModes: the agent advertised no modes for the session.
	ErrNoModes = errors.New("acp: the agent has no modes")
	// ErrUnknownMode: the id is none of the session's available modes.
	ErrUnknownMode = errors.New("acp: unknown mode")
)

// parseModes reads a SessionModeState (session/new's, session/load's or
// session/resume's "modes"); ok is false when there is none or it is
// malformed. Modes with an empty or too long id, or repeating one, are
// dropped; at most maxModes are kept.
func parseModes(raw json.RawMessage) (ms Modes, ok bool) {
	var in struct {
		CurrentModeID  string `json:"currentModeId"`
		AvailableModes []struct {
			ID          string  `json:"id"`
			Name        string  `json:"name"`
			Description *string `json:"description"`
		} `json:"availableModes"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &in) != nil || in.AvailableModes == nil {
		return Modes{}, false
	}
	seen := map[string]bool{}
	for _, m := range in.AvailableModes {
		if m.ID == "" || len(m.ID) > maxModeID || seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		desc := ""
		if m.Description != nil {
			desc = cutRunes(oneLine(*m.Description), maxCommandDesc)
		}
		ms.Available = append(ms.Available, Mode{ID: m.ID, Name: cutRunes(oneLine(m.Name), maxModeID), Description: desc})
		if len(ms.Available) == maxModes {
			break
		}
	}
	ms.Current = cutRunes(in.CurrentModeID, maxModeID)
	return ms, true
}

// keepModes records the modes ("modes", a SessionModeState) that a
// session/new, session/load or session/resume answer gives session id of
// ag, if any; result is the whole answer.
func (ag *agent) keepModes(id string, result json.RawMessage) {
	var res struct {
		Modes json.RawMessage `json:"modes"`
	}
	if json.Unmarshal(result, &res) != nil {
		return
	}
	if ms, ok := parseModes(res.Modes); ok {
		ag.meta.with(id, func(m *sessionMeta) { m.modes = ms })
	}
}

// Modes returns the modes of the agent session serving the current
// conversation of session key key; ok is false when no session is open.
func (r *Runner) Modes(key string) (ms Modes, ok bool) {
	ag, id := r.sessionOf(key)
	if ag == nil {
		return Modes{}, false
	}
	return ag.meta.get(id).modes, true
}

// SetMode switches the agent session serving the current conversation of
// session key key to mode id with session/set_mode (bounded by
// startTimeoutSeconds). Errors: ErrNoSession, ErrNoModes, ErrUnknownMode,
// or the agent's failure (wrapped).
func (r *Runner) SetMode(ctx context.Context, key, id string) error {
	ag, sid := r.sessionOf(key)
	if ag == nil {
		return ErrNoSession
	}
	ms := ag.meta.get(sid).modes
	if len(ms.Available) == 0 {
		return ErrNoModes
	}
	known := false
	for _, m := range ms.Available {
		known = known || m.ID == id
	}
	if !known {
		return fmt.Errorf("%w %q", ErrUnknownMode, cutRunes(id, maxModeID))
	}
	if err := ag.call(ctx, r.startTimeout, "session/set_mode", map[string]any{"sessionId": sid, "modeId": id}, nil); err != nil {
		return fmt.Errorf("acp: session/set_mode %q: %w", id, err)
	}
	ag.meta.with(sid, func(m *sessionMeta) { m.modes.Current = id })
	return nil
}
