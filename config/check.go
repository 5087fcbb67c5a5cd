package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/timeout"
)

// Warnings are the values of a valid configuration that do not take effect
// as written: a wall clock above the hard maximum (turns stop at the
// maximum), a positive timeout below the 0.1 s minimum (raised to it), a
// model idle timeout that leaves agents.openai.fallbacks no time, a
// busy.debounceMs in cluster mode (ignored there). They
// are not errors — the gateway runs — but `gateway -check` and start-up say
// them, each naming its key, so the clamp timeout.Resolve applies is never
// a surprise. A warning holds no secret (only numbers).
func (c *Config) Warnings() []Problem {
	var out []Problem
	layers := []struct {
		prefix string
		keys   timeout.Keys
	}{
		{"agents.defaults", c.Agents.Defaults.Keys},
		{"channels.ws.timeouts", c.Channels.WS.Timeouts},
		{"channels.telegram.timeouts", c.Channels.Telegram.Timeouts},
	}
	for _, l := range layers {
		for _, f := range l.keys.Named() {
			if f.V != nil && *f.V > 0 && *f.V < timeout.Min.Seconds() {
				key := l.prefix + "." + f.Name
				out = append(out, Problem{Key: key, Text: fmt.Sprintf("%s: %s is below the minimum of %s, so %s is used",
					key, seconds(*f.V), seconds(timeout.Min.Seconds()), messages.Duration(timeout.Min))})
			}
		}
	}
	seen := map[string]bool{}
	for _, ch := range []string{ChannelWS, ChannelTelegram} {
		s := c.TurnSettings(ch, 0)
		wallKey, wall := "timeoutSeconds (built-in default)", float64(timeout.DefaultTimeoutSeconds)
		ceilKey := "the built-in maxTurnTimeSeconds"
		chLayer := layers[1]
		if ch == ChannelTelegram {
			chLayer = layers[2]
		}
		for _, l := range []struct {
			prefix string
			keys   timeout.Keys
		}{chLayer, layers[0]} {
			if l.keys.TimeoutSeconds != nil {
				wallKey, wall = l.prefix+".timeoutSeconds", *l.keys.TimeoutSeconds
				break
			}
		}
		for _, l := range []struct {
			prefix string
			keys   timeout.Keys
		}{chLayer, layers[0]} {
			if l.keys.MaxTurnTimeSeconds != nil {
				ceilKey = l.prefix + ".maxTurnTimeSeconds"
				break
			}
		}
		if s.MaxTurnTime <= 0 || wall <= s.MaxTurnTime.Seconds() || seen[wallKey+ceilKey] {
			continue
		}
		seen[wallKey+ceilKey] = true
		out = append(out, Problem{Key: wallKey, Text: fmt.Sprintf(
			"%s: %s (%s) is above the hard maximum of %s (%s, %s), so turns stop at %s; raise maxTurnTimeSeconds or lower timeoutSeconds",
			wallKey, seconds(wall), messages.Duration(time.Duration(wall*float64(time.Second))),
			seconds(s.MaxTurnTime.Seconds()), messages.Duration(s.MaxTurnTime), ceilKey, messages.Duration(s.MaxTurnTime))})
	}
	out = append(out, c.fallbackWarnings()...)
	return append(out, c.debounceWarnings()...)
}

// debounceWarnings: in cluster mode busy.debounceMs is ignored — a message
// to an idle session claims it and starts its turn at once (a burst held
// on one replica could not hold a message another replica takes, so the
// burst is not merged there).
func (c *Config) debounceWarnings() []Problem {
	if !c.Cluster.Enabled {
		return nil
	}
	var out []Problem
	for _, l := range []struct {
		key string
		b   Busy
	}{{"agents.defaults.busy.debounceMs", c.Agents.Defaults.Busy}, {"channels.ws.busy.debounceMs", c.Channels.WS.Busy},
		{"channels.telegram.busy.debounceMs", c.Channels.Telegram.Busy}} {
		if l.b.DebounceMs != nil && *l.b.DebounceMs > 0 {
			out = append(out, Problem{Key: l.key, Text: fmt.Sprintf(
				"%s: %d ms is ignored in cluster mode (cluster.enabled): each message starts its turn, or queues, at once", l.key, *l.b.DebounceMs)})
		}
	}
	return out
}

// fallbackWarnings: with agents.openai.fallbacks, a channel on the openai
// runner whose step timeout is not above agents.openai.llmIdleTimeoutSeconds
// stops a turn (the liveness window ends) before the runner leaves a
// silent provider for the next one.
func (c *Config) fallbackWarnings() []Problem {
	o := c.Agents.OpenAI
	if len(o.Fallbacks) == 0 {
		return nil
	}
	idle := o.LLMIdleTimeoutSeconds
	if idle == 0 {
		idle = 120 // the runner's default (runner/openai.DefaultLLMIdleTimeout)
	}
	var out []Problem
	for _, ch := range []string{ChannelWS, ChannelTelegram} {
		if c.RunnerFor(ch) != RunnerOpenAI || (ch == ChannelTelegram && !c.Channels.Telegram.Enabled) {
			continue
		}
		step := c.TurnSettings(ch, 0).StepTimeout
		if step <= 0 || idle < step.Seconds() {
			continue
		}
		out = append(out, Problem{Key: "agents.openai.llmIdleTimeoutSeconds", Text: fmt.Sprintf(
			"agents.openai.llmIdleTimeoutSeconds: %s (%s) is not below the %s channel's step timeout (%s), so a silent provider stops the turn before agents.openai.fallbacks are tried; lower llmIdleTimeoutSeconds",
			seconds(idle), messages.Duration(time.Duration(idle*float64(time.Second))), ch, messages.Duration(step))})
	}
	return out
}

func seconds(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// CheckReport loads the configuration at path as Load does (environment
// included) and words the result for `gateway -check`: every problem on a
// line of its own, or every warning on a line of its own ("warning: …")
// followed by "config OK: …". ok is false when the configuration cannot be
// used.
func CheckReport(path string) (report string, ok bool) {
	c, err := Load(path)
	what := path
	if what == "" {
		what = "built-in defaults and environment"
	}
	var b strings.Builder
	if err != nil {
		var ce *Error
		if !errors.As(err, &ce) || len(ce.Problems) == 1 {
			return err.Error() + "\n", false
		}
		fmt.Fprintf(&b, "config %s: %d problems:\n", what, len(ce.Problems))
		for _, p := range ce.Problems {
			fmt.Fprintf(&b, "  %s\n", p.Text)
		}
		return b.String(), false
	}
	warns := c.Warnings()
	for _, w := range warns {
		fmt.Fprintf(&b, "warning: %s\n", w.Text)
	}
	switch len(warns) {
	case 0:
		fmt.Fprintf(&b, "config OK: %s\n", what)
	case 1:
		fmt.Fprintf(&b, "config OK with 1 warning: %s\n", what)
	default:
		fmt.Fprintf(&b, "config OK with %d warnings: %s\n", len(warns), what)
	}
	return b.String(), true
}
