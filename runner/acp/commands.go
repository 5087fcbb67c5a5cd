package acp

import (
	"encoding/json"
	"regexp"
	"strings"
	"sync"
)

// Bounds of what the runner keeps of an agent session's commands and modes.
const (
	// maxCommands is how many of an agent's slash commands are kept per
	// session (Telegram's command menu takes at most 100).
	maxCommands = 100
	// maxCommandDesc bounds a command's or mode's description (Telegram's
	// limit for a command's).
	maxCommandDesc = 256
	// maxMetaSessions bounds the agent sessions whose commands and modes an
	// agent process keeps; updates of further sessions are dropped.
	maxMetaSessions = 1000
)

// commandName is Telegram's rule for a command's name, which every channel
// follows so that a command works alike everywhere.
var commandName = regexp.MustCompile(`^[a-z0-9_]{1,32}$`)

// Command is one slash command the agent advertises for a session
// (available_commands_update): invoked by sending "/name args" as the prompt.
type Command struct {
	Name        string // [a-z0-9_]{1,32}
	Description string // at most maxCommandDesc runes, one line
}

// sessionMeta is what the agent said about one of its sessions outside a
// turn's reply: its commands and its modes.
type sessionMeta struct {
	commands []Command
	modes    Modes
	options  []ConfigOption // config options (options.go)
}

// metas is an agent process's sessionMeta by ACP session id, bounded by
// maxMetaSessions.
type metas struct {
	mu sync.Mutex
	m  map[string]*sessionMeta
}

// with calls f with the meta of session id (created when missing and room
// is left; f is not called when none is); mu is held.
func (ms *metas) with(id string, f func(*sessionMeta)) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.m == nil {
		ms.m = map[string]*sessionMeta{}
	}
	m := ms.m[id]
	if m == nil {
		if id == "" || len(ms.m) >= maxMetaSessions {
			return
		}
		m = &sessionMeta{}
		ms.m[id] = m
	}
	f(m)
}

// get returns a copy of the meta of session id (zero when none).
func (ms *metas) get(id string) sessionMeta {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	m := ms.m[id]
	if m == nil {
		return sessionMeta{}
	}
	return sessionMeta{
		commands: append([]Command(nil), m.commands...),
		modes:    Modes{Current: m.modes.Current, Available: append([]Mode(nil), m.modes.Available...)},
		options:  append([]ConfigOption(nil), m.options...), // a value's Values are never changed in place
	}
}

// forget drops the meta of session id.
func (ms *metas) forget(id string) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	delete(ms.m, id)
}

// parseCommands reads available_commands_update's availableCommands: a
// command whose name breaks Telegram's rule (after lower-casing) or repeats
// one is dropped, a description is made one line and cut to
// maxCommandDesc, and at most maxCommands are kept.
func parseCommands(raw json.RawMessage) []Command {
	var in []struct {
		Name        string `json:"name"`
		Description string `json:"description"`
	}
	if json.Unmarshal(raw, &in) != nil {
		return nil
	}
	out := []Command{}
	seen := map[string]bool{}
	for _, c := range in {
		name := strings.ToLower(strings.TrimPrefix(strings.TrimSpace(c.Name), "/"))
		if !commandName.MatchString(name) || seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, Command{Name: name, Description: cutRunes(oneLine(c.Description), maxCommandDesc)})
		if len(out) == maxCommands {
			break
		}
	}
	return out
}

// cutRunes cuts s to at most n runes.
func cutRunes(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n])
}

// sessionUpdate keeps what a session/update of session id says about the
// session itself (available_commands_update, current_mode_update,
// config_option_update),
// whether or not a turn runs on it.
func (ms *metas) sessionUpdate(id string, raw json.RawMessage) {
	var u struct {
		SessionUpdate     string          `json:"sessionUpdate"`
		AvailableCommands json.RawMessage `json:"availableCommands"`
		CurrentModeID     string          `json:"currentModeId"`
		ConfigOptions     json.RawMessage `json:"configOptions"`
	}
	if json.Unmarshal(raw, &u) != nil {
		return
	}
	switch u.SessionUpdate {
	case "available_commands_update":
		cmds := parseCommands(u.AvailableCommands)
		ms.with(id, func(m *sessionMeta) { m.commands = cmds })
	case "current_mode_update":
		if u.CurrentModeID == "" {
			return
		}
		ms.with(id, func(m *sessionMeta) { m.modes.Current = cutRunes(u.CurrentModeID, maxModeID) })
	case "config_option_update":
		if opts, ok := parseConfigOptions(u.ConfigOptions); ok {
			ms.with(id, func(m *sessionMeta) { m.options = opts })
		}
	}
}

// Commands returns the slash commands the agent advertised for the current
// conversation of session key key (nil when none, or no session is open).
func (r *Runner) Commands(key string) []Command {
	ag, id := r.sessionOf(key)
	if ag == nil {
		return nil
	}
	return ag.meta.get(id).commands
}

// sessionOf returns the agent and ACP session id serving the current
// conversation of session key key (nil, "" when none is open).
func (r *Runner) sessionOf(key string) (*agent, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	conv, ok := r.tab.keys[key]
	if !ok {
		return nil, ""
	}
	s := r.tab.convs[conv]
	if s == nil || s.id == "" || s.ag == nil || s.ag.isDead() {
		return nil, ""
	}
	return s.ag, s.id
}
