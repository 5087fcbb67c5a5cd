package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// sources records where a loaded Config's values came from: the file (its
// name and the keys it set) and the environment (key → the GATEWAY_
// variable that set it). Every other value is a built-in default.
type sources struct {
	file     string
	fileKeys map[string]bool
	env      map[string]string
}

// newSources records them; with neither a file nor a variable it is the
// zero sources (so two such Configs compare equal).
func newSources(file string, fileKeys []string, env map[string]string) sources {
	s := sources{file: file}
	if len(env) > 0 {
		s.env = maps.Clone(env)
	}
	for _, k := range fileKeys {
		if s.fileKeys == nil {
			s.fileKeys = make(map[string]bool, len(fileKeys))
		}
		s.fileKeys[k] = true
	}
	return s
}

// Sources names what the configuration was built from, for the start-up
// log: "turnguard.yaml", "turnguard.yaml + GATEWAY_SERVER__TOKEN",
// "built-in defaults + GATEWAY_A, GATEWAY_B", "built-in defaults". Only
// variable names are given, never values.
func (c *Config) Sources() string {
	what := c.src.file
	if what == "" {
		what = "built-in defaults"
	}
	if vars := slices.Sorted(maps.Values(c.src.env)); len(vars) > 0 {
		what += " + " + strings.Join(vars, ", ")
	}
	return what
}

// Source names where the value of key (a flat key path, "server.token")
// came from: "env GATEWAY_…" when a variable set it, "file" when the file
// did (the key, a section, map or list above it, or a key below it), else
// "default" — or, for server.operatorToken left unset with server.token
// set, server.token's source.
func (c *Config) Source(key string) string {
	if s := c.setBy(key); s != "" {
		return s
	}
	if key == "server.operatorToken" && c.Server.Token != "" {
		if s := c.setBy("server.token"); s != "" {
			return "server.token's (" + s + ")"
		}
	}
	return "default"
}

// setBy is Source without the default: "" when neither the file nor the
// environment set key.
func (c *Config) setBy(key string) string {
	if v, ok := c.src.env[key]; ok {
		return "env " + v
	}
	for k := range c.src.fileKeys {
		if k == key || strings.HasPrefix(key, k+".") || strings.HasPrefix(k, key+".") {
			return "file"
		}
	}
	return ""
}

// Flat is the configuration as flat key paths ("server.listen") and their
// printed values, secrets redacted (see Redacted), sorted by key; a list is
// one value. Unset keys are left out.
func (c *Config) Flat() [][2]string { return flatten(c.Redacted()) }

func flatten(r Config) [][2]string {
	var out [][2]string
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		if m, ok := v.(map[string]any); ok {
			for k, sub := range m {
				walk(joinKey(prefix, k), sub)
			}
			return
		}
		out = append(out, [2]string{prefix, printValue(v)})
	}
	walk("", toPlain(reflect.ValueOf(r)))
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	return out
}

func printValue(v any) string {
	switch x := v.(type) {
	case string:
		return fmt.Sprintf("%q", x)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = printValue(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case map[string]any:
		keys := slices.Sorted(maps.Keys(x))
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + ": " + printValue(x[k])
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(v)
}

// PrintConfig renders the effective configuration for `gateway
// -print-config`: one line a key, "key: value  # source", secrets redacted,
// the source default, file or the GATEWAY_ variable.
func (c *Config) PrintConfig() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# turnguard configuration from %s; secrets redacted\n", c.Sources())
	for _, kv := range c.Flat() {
		fmt.Fprintf(&b, "%s: %s  # %s\n", kv[0], kv[1], c.Source(kv[0]))
	}
	b.WriteString("# the limits of a turn in force (the timeout keys above over the built-in defaults, clamped):\n")
	for _, ch := range []string{ChannelWS, ChannelTelegram} {
		s := c.TurnSettings(ch, 0)
		fmt.Fprintf(&b, "# %s: timeoutSeconds %s, stepTimeoutSeconds %s, maxTurnTimeSeconds %s, progressNotifyAfterSeconds %s, "+
			"progressRepeatSeconds %s, abortGraceSeconds %s, approvalTimeoutSeconds %s, livenessResetOn %s, budgetWarningRatio %s\n", ch,
			seconds(s.Timeout.Seconds()), seconds(s.StepTimeout.Seconds()), seconds(s.MaxTurnTime.Seconds()),
			seconds(s.ProgressNotifyAfter.Seconds()), seconds(s.ProgressRepeat.Seconds()), seconds(s.AbortGrace.Seconds()),
			seconds(s.ApprovalTimeout.Seconds()), s.LivenessResetOn, strconv.FormatFloat(s.BudgetWarningRatio, 'f', -1, 64))
	}
	return b.String()
}

// Changed lists the keys whose values differ between old and next, sorted;
// a secret that changed is named with " (secret)" ("server.token
// (secret)"), its value never shown.
func Changed(old, next *Config) []string {
	shown, raw := pairs(old.Flat(), next.Flat()), pairs(flatten(*old), flatten(*next))
	var out []string
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		switch {
		case shown[k][0] != shown[k][1]:
			out = append(out, k)
		case raw[k][0] != raw[k][1]:
			out = append(out, k+" (secret)")
		}
	}
	return out
}

// pairs maps each key of a and b to its value in each.
func pairs(a, b [][2]string) map[string][2]string {
	m := map[string][2]string{}
	for _, kv := range a {
		m[kv[0]] = [2]string{kv[1], m[kv[0]][1]}
	}
	for _, kv := range b {
		m[kv[0]] = [2]string{m[kv[0]][0], kv[1]}
	}
	return m
}
