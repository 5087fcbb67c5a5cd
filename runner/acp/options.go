package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Session config options (ACP's configOptions: a model, a reasoning level,
// an on/off toggle) are the agent's settings other than modes. The runner
// keeps them per session from session/new, session/load and session/resume
// answers, config_option_update notifications and set_config_option
// answers; /mode lists them after the modes and /mode <id> <value> sets one
// with session/set_config_option.

// Bounds of the config options kept per session.
const (
	maxConfigOptions = 20 // options of one session
	maxConfigValues  = 50 // values of one select option (groups flattened)
)

// ConfigOption is one of an agent session's settings: a select (Values,
// Current one of their ids) or a boolean (Current "on" or "off", no
// Values).
type ConfigOption struct {
	ID, Name, Description string
	Boolean               bool
	Current               string
	Values                []ConfigValue
}

// ConfigValue is one value of a select option.
type ConfigValue struct {
	ID, Name string
}

// Errors of SetConfigOption.
var (
	// ErrUnknownOption: the id is none of the session's config options.
	ErrUnknownOption = errors.New("acp: unknown config option")
	// ErrUnknownValue: the value is none of the option's (on or off for a
	// boolean).
	ErrUnknownValue = errors.New("acp: unknown value")
)

// parseConfigOptions reads a configOptions array; ok is false when there
// is none or it is malformed. An option with an empty, too long or
// repeated id, or of another type than select and boolean, is dropped; at
// most maxConfigOptions are kept, each with at most maxConfigValues values.
func parseConfigOptions(raw json.RawMessage) (out []ConfigOption, ok bool) {
	type value struct {
		Value string `json:"value"`
		Name  string `json:"name"`
	}
	var in []struct {
		ID           string          `json:"id"`
		Name         string          `json:"name"`
		Description  *string         `json:"description"`
		Type         string          `json:"type"`
		CurrentValue json.RawMessage `json:"currentValue"`
		Options      []struct {
			value
			Options []value `json:"options"` // a group's
		} `json:"options"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &in) != nil || in == nil {
		return nil, false
	}
	seen := map[string]bool{}
	out = []ConfigOption{}
	for _, o := range in {
		if o.ID == "" || len(o.ID) > maxModeID || seen[o.ID] {
			continue
		}
		c := ConfigOption{ID: o.ID, Name: cutRunes(oneLine(o.Name), maxModeID)}
		if o.Description != nil {
			c.Description = cutRunes(oneLine(*o.Description), maxCommandDesc)
		}
		switch o.Type {
		case "boolean":
			var b bool
			if json.Unmarshal(o.CurrentValue, &b) != nil {
				continue
			}
			c.Boolean, c.Current = true, onOff(b)
		case "select":
			var cur string
			if json.Unmarshal(o.CurrentValue, &cur) != nil {
				continue
			}
			c.Current = cutRunes(cur, maxModeID)
			add := func(v value) {
				if v.Value != "" && len(v.Value) <= maxModeID && len(c.Values) < maxConfigValues {
					c.Values = append(c.Values, ConfigValue{ID: v.Value, Name: cutRunes(oneLine(v.Name), maxModeID)})
				}
			}
			for _, v := range o.Options {
				add(v.value)
				for _, g := range v.Options {
					add(g)
				}
			}
		default:
			continue
		}
		seen[o.ID] = true
		out = append(out, c)
		if len(out) == maxConfigOptions {
			break
		}
	}
	return out, true
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// keepConfigOptions records the config options ("configOptions") that an
// answer (session/new, session/load, session/resume,
// session/set_config_option) or a config_option_update gives session id
// of ag, if any.
func (ag *agent) keepConfigOptions(id string, result json.RawMessage) {
	var res struct {
		ConfigOptions json.RawMessage `json:"configOptions"`
	}
	if json.Unmarshal(result, &res) != nil {
		return
	}
	if opts, ok := parseConfigOptions(res.ConfigOptions); ok {
		ag.meta.with(id, func(m *sessionMeta) { m.options = opts })
	}
}

// ConfigOptions returns the config options of the agent session serving
// the current conversation of session key key; ok is false when no
// session is open.
func (r *Runner) ConfigOptions(key string) (opts []ConfigOption, ok bool) {
	ag, id := r.sessionOf(key)
	if ag == nil {
		return nil, false
	}
	return ag.meta.get(id).options, true
}

// SetConfigOption sets config option id of the agent session serving the
// current conversation of session key key to value (a value id; on/off,
// true/false, yes/no for a boolean) with session/set_config_option
// (bounded by startTimeoutSeconds); the agent's answer replaces the
// session's options. Errors: ErrNoSession, ErrUnknownOption,
// ErrUnknownValue, or the agent's failure (wrapped).
func (r *Runner) SetConfigOption(ctx context.Context, key, id, value string) error {
	ag, sid := r.sessionOf(key)
	if ag == nil {
		return ErrNoSession
	}
	var opt *ConfigOption
	opts := ag.meta.get(sid).options
	for i := range opts {
		if opts[i].ID == id {
			opt = &opts[i]
		}
	}
	if opt == nil {
		return fmt.Errorf("%w %q", ErrUnknownOption, cutRunes(id, maxModeID))
	}
	params := map[string]any{"sessionId": sid, "configId": id}
	if opt.Boolean {
		switch strings.ToLower(value) {
		case "on", "true", "yes":
			params["type"], params["value"] = "boolean", true
		case "off", "false", "no":
			params["type"], params["value"] = "boolean", false
		default:
			return fmt.Errorf("%w %q", ErrUnknownValue, cutRunes(value, maxModeID))
		}
	} else {
		known := false
		for _, v := range opt.Values {
			known = known || v.ID == value
		}
		if !known {
			return fmt.Errorf("%w %q", ErrUnknownValue, cutRunes(value, maxModeID))
		}
		params["value"] = value
	}
	var res json.RawMessage
	if err := ag.call(ctx, r.startTimeout, "session/set_config_option", params, &res); err != nil {
		return fmt.Errorf("acp: session/set_config_option %q: %w", id, err)
	}
	ag.keepConfigOptions(sid, res)
	return nil
}
