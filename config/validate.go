package config

import (
	"fmt"
	"math"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/turnguard/turnguard/gateway/messages"
	"github.com/turnguard/turnguard/timeout"
)

// Runner names (agents.defaults.runner, channels.*.runner).
const (
	RunnerDemo   = "demo"
	RunnerOpenAI = "openai"
	RunnerExec   = "exec"
)

// Telegram modes (channels.telegram.mode).
const (
	TelegramPolling = "polling"
	TelegramWebhook = "webhook"
)

// Exec output formats (agents.exec.format).
const (
	ExecFormatJSONL            = "jsonl"
	ExecFormatClaudeStreamJSON = "claude-stream-json"
)

// Channel names understood by TurnSettings and RunnerFor.
const (
	ChannelWS       = "ws"
	ChannelTelegram = "telegram"
)

// Validate reports every problem with c as an *Error naming the keys (its
// File is empty; Load fills it in), or nil. Load already validates; call
// Validate on a Config built or changed in code.
func (c *Config) Validate() error {
	if _, probs := c.validate(); len(probs) > 0 {
		return &Error{Problems: probs}
	}
	return nil
}

type problems []Problem

func (p *problems) add(key, format string, args ...any) {
	*p = append(*p, Problem{Key: key, Text: key + ": " + fmt.Sprintf(format, args...)})
}

func (p *problems) positive(key string, v int) {
	if v <= 0 {
		p.add(key, "must be a whole number > 0, got %d", v)
	}
}

func (p *problems) nonNegative(key string, v int) {
	if v < 0 {
		p.add(key, "must be a whole number ≥ 0, got %d", v)
	}
}

func (p *problems) positiveFloat(key string, v float64) {
	if !(v > 0) || math.IsInf(v, 0) {
		p.add(key, "must be a number > 0, got %v", v)
	}
}

// httpURL checks an optional URL without echoing it (URLs can carry tokens).
func (p *problems) httpURL(key, v string) {
	if v == "" {
		return
	}
	u, err := url.Parse(v)
	switch {
	case err != nil || u.Host == "":
		p.add(key, "must be an absolute http or https URL")
	case u.Scheme != "http" && u.Scheme != "https":
		p.add(key, "must be an http or https URL")
	}
}

func (p *problems) oneOf(key, v string, allowed ...string) {
	for _, a := range allowed {
		if v == a {
			return
		}
	}
	p.add(key, "must be one of %s, got %q", strings.Join(allowed, ", "), v)
}

var (
	toolName      = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	webhookSecret = regexp.MustCompile(`^[A-Za-z0-9_-]{1,256}$`)
)

// validate checks c and parses its message templates.
func (c *Config) validate() (*messages.Set, []Problem) {
	var p problems

	s := c.Server
	if host, port, err := net.SplitHostPort(s.Listen); err != nil {
		p.add("server.listen", "must be host:port, such as 127.0.0.1:18789, got %q", s.Listen)
	} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		p.add("server.listen", "port must be a number from 0 to 65535, got %q", port)
	} else if s.Token == "" && !isLoopback(host) {
		p = append(p, Problem{Key: "server.token", Text: fmt.Sprintf(
			"server.token is required when server.listen (%s) is not a loopback address", s.Listen)})
	}
	p.positive("server.maxConnsPerIP", s.MaxConnsPerIP)
	p.positiveFloat("server.requestsPerSecond", s.RequestsPerSecond)
	p.positive("server.requestBurst", s.RequestBurst)
	p.positive("server.tickIntervalMs", s.TickIntervalMs)
	p.positive("server.maxPayloadBytes", s.MaxPayloadBytes)
	p.positive("server.maxMessageChars", s.MaxMessageChars)
	p.positive("server.sendQueue", s.SendQueue)
	p.positiveFloat("server.idempotencyTTLSeconds", s.IdempotencyTTLSeconds)
	p.positive("server.historyLimit", s.HistoryLimit)

	p.timeouts("agents.defaults", c.Agents.Defaults.Keys)
	p.timeouts("channels.ws.timeouts", c.Channels.WS.Timeouts)
	p.timeouts("channels.telegram.timeouts", c.Channels.Telegram.Timeouts)

	if r := c.Agents.Defaults.MaxReplyChars; r < 1 || r > MaxReplyCharsLimit {
		p.add("agents.defaults.maxReplyChars", "must be an integer from 1 to %d, got %d", MaxReplyCharsLimit, r)
	}

	runners := []string{RunnerDemo, RunnerOpenAI, RunnerExec}
	p.oneOf("agents.defaults.runner", c.Agents.Defaults.Runner, runners...)
	if r := c.Channels.WS.Runner; r != "" {
		p.oneOf("channels.ws.runner", r, runners...)
	}
	if r := c.Channels.Telegram.Runner; r != "" {
		p.oneOf("channels.telegram.runner", r, runners...)
	}
	used := map[string]bool{c.Agents.Defaults.Runner: true, c.RunnerFor(ChannelWS): true}
	if c.Channels.Telegram.Enabled {
		used[c.RunnerFor(ChannelTelegram)] = true
	}

	o := c.Agents.OpenAI
	if used[RunnerOpenAI] && o.Model == "" {
		p.add("agents.openai.model", "is required when the openai runner is used")
	}
	p.httpURL("agents.openai.baseURL", o.BaseURL)
	p.positive("agents.openai.maxSteps", o.MaxSteps)
	p.positiveFloat("agents.openai.llmIdleTimeoutSeconds", o.LLMIdleTimeoutSeconds)
	h := o.Tools.HTTPGet
	p.positive("agents.openai.tools.httpGet.maxBytes", h.MaxBytes)
	p.positiveFloat("agents.openai.tools.httpGet.timeoutSeconds", h.TimeoutSeconds)
	if h.Enabled && len(h.Allow) == 0 {
		p.add("agents.openai.tools.httpGet.allow", "must list at least one URL prefix when httpGet is enabled")
	}
	for i, a := range h.Allow {
		p.httpURL(fmt.Sprintf("agents.openai.tools.httpGet.allow[%d]", i), a)
		if a == "" {
			p.add(fmt.Sprintf("agents.openai.tools.httpGet.allow[%d]", i), "must not be empty")
		}
	}
	names := map[string]int{}
	for i, t := range o.Tools.Commands {
		key := fmt.Sprintf("agents.openai.tools.commands[%d]", i)
		if !toolName.MatchString(t.Name) {
			p.add(key+".name", "must be 1–64 characters of A-Z, a-z, 0-9, _ and -, got %q", t.Name)
		} else if j, dup := names[t.Name]; dup {
			p.add(key+".name", "%q is already the name of commands[%d]", t.Name, j)
		} else {
			names[t.Name] = i
		}
		if len(t.Argv) == 0 || t.Argv[0] == "" {
			p.add(key+".argv", "must name the program to run")
		}
		if !(t.TimeoutSeconds >= 0) || math.IsInf(t.TimeoutSeconds, 0) {
			p.add(key+".timeoutSeconds", "must be a number ≥ 0, got %v", t.TimeoutSeconds)
		}
		p.nonNegative(key+".maxOutputBytes", t.MaxOutputBytes)
	}

	e := c.Agents.Exec
	if used[RunnerExec] && e.Command == "" {
		p.add("agents.exec.command", "is required when the exec runner is used")
	}
	p.oneOf("agents.exec.format", e.Format, ExecFormatJSONL, ExecFormatClaudeStreamJSON)

	tg := c.Channels.Telegram
	p.oneOf("channels.telegram.mode", tg.Mode, TelegramPolling, TelegramWebhook)
	if tg.Enabled && tg.Token == "" {
		p.add("channels.telegram.token", "is required when channels.telegram.enabled is true")
	}
	if tg.Enabled && tg.Mode == TelegramWebhook && tg.WebhookSecret == "" {
		p.add("channels.telegram.webhookSecret", "is required in webhook mode")
	}
	if tg.WebhookSecret != "" && !webhookSecret.MatchString(tg.WebhookSecret) {
		p.add("channels.telegram.webhookSecret", "must be 1–256 characters of A-Z, a-z, 0-9, _ and -")
	}
	p.httpURL("channels.telegram.apiURL", tg.APIURL)
	if tg.APIURL == "" {
		p.add("channels.telegram.apiURL", "must not be empty")
	}
	p.httpURL("channels.telegram.webhookURL", tg.WebhookURL)
	p.positive("channels.telegram.maxInputChars", tg.MaxInputChars)

	if c.Store.Path == "" {
		p.add("store.path", `must not be empty (use ":memory:" for no file)`)
	}
	p.positive("store.queueSize", c.Store.QueueSize)

	p.positive("alerts.stepTimeoutBurst", c.Alerts.StepTimeoutBurst)
	if c.Alerts.Window <= 0 {
		p.add("alerts.window", "must be a duration > 0, got %s", c.Alerts.Window)
	}
	p.httpURL("alerts.webhookURL", c.Alerts.WebhookURL)

	set, err := messages.Parse(c.Messages)
	if err != nil {
		key, _, _ := strings.Cut(err.Error(), ":")
		p = append(p, Problem{Key: key, Text: err.Error()})
	}
	return set, p
}

// timeouts checks one layer of timeout keys: timeout.Keys.Check's rules,
// and 0 refused for the keys where 0 cannot mean "disabled" (Resolve would
// turn it into the 0.1 s minimum, which is never what was meant).
func (p *problems) timeouts(prefix string, k timeout.Keys) {
	if err := k.Check(prefix); err != nil {
		key, _, _ := strings.Cut(err.Error(), ":")
		*p = append(*p, Problem{Key: key, Text: err.Error()})
		return
	}
	for _, z := range []struct {
		name string
		v    *float64
		why  string
	}{
		{"timeoutSeconds", k.TimeoutSeconds, "the wall clock cannot be disabled"},
		{"progressRepeatSeconds", k.ProgressRepeatSeconds, "to turn progress notices off set progressNotifyAfterSeconds: 0"},
		{"abortGraceSeconds", k.AbortGraceSeconds, "a stop always allows some grace"},
	} {
		if z.v != nil && *z.v == 0 {
			p.add(prefix+"."+z.name, "must be > 0 (%s); leave it out for the default", z.why)
		}
	}
}

// isLoopback reports whether a listen host accepts loopback connections
// only: localhost, 127.0.0.0/8 or ::1. An empty host (all interfaces) and
// any other name are not.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	host, _, _ = strings.Cut(host, "%") // an IPv6 zone
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
