package config

import (
	"fmt"
	"maps"
	"math"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/timeout"
)

// Runner names (agents.defaults.runner, channels.*.runner).
const (
	RunnerDemo   = "demo"
	RunnerOpenAI = "openai"
	RunnerExec   = "exec"
	RunnerACP    = "acp"
)

// Telegram modes (channels.telegram.mode).
const (
	TelegramPolling = "polling"
	TelegramWebhook = "webhook"
)

// How a running Telegram turn is shown (channels.telegram.streaming).
const (
	// TelegramStreamDraft: in private chats the turn streams into a
	// Telegram draft (sendMessageDraft) with a Stop button; elsewhere as
	// TelegramStreamEdit.
	TelegramStreamDraft = "draft"
	// TelegramStreamEdit: the step lines and the "still working" notice
	// are messages edited in place.
	TelegramStreamEdit = "edit"
	// TelegramStreamOff: nothing live but the typing indicator.
	TelegramStreamOff = "off"
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

// Upper bounds of the engine's memory keys.
const (
	MaxSessionsLimit        = 1_000_000
	SessionIdleSecondsLimit = 7 * 24 * 3600
	MaxStuckRunsLimit       = 1000
)

func (p *problems) add(key, format string, args ...any) {
	*p = append(*p, Problem{Key: key, Text: key + ": " + fmt.Sprintf(format, args...)})
}

// bound is the range of one numeric key. Every size, count, rate and
// duration key has one, so that no value can overflow a time.Duration or an
// allocation; docs/configuration.md lists each (TestDocsListBounds).
type bound struct {
	min, max float64
	above    bool   // the value must be > min (else ≥ min)
	below    bool   // the value must be < max (else ≤ max)
	zero     string // what 0 means when it is allowed: "disabled"
	maxText  string // the human form of max: "24h", "64 MiB"; "" for a plain number
	why      string // said after the value: why the lower bound
}

func (b bound) String() string {
	s := strconv.FormatFloat(b.max, 'f', -1, 64)
	if b.maxText != "" {
		s += " (" + b.maxText + ")"
	}
	return s
}

// Bounds of the timeout keys, as timeout.Resolve's maxima.
var timeoutBounds = map[string]bound{
	"timeoutSeconds":             {max: timeout.MaxWallClock.Seconds(), above: true, maxText: "7d", why: "the wall clock cannot be disabled; leave it out for the default"},
	"stepTimeoutSeconds":         {max: timeout.MaxStep.Seconds(), zero: "disabled", maxText: "24h"},
	"maxTurnTimeSeconds":         {max: timeout.MaxCeiling.Seconds(), zero: "no ceiling", maxText: "7d"},
	"progressNotifyAfterSeconds": {max: timeout.MaxProgress.Seconds(), zero: "disabled", maxText: "24h"},
	"progressRepeatSeconds":      {max: timeout.MaxProgress.Seconds(), above: true, maxText: "24h", why: "to turn progress notices off set progressNotifyAfterSeconds: 0"},
	"abortGraceSeconds":          {max: timeout.MaxAbortGrace.Seconds(), above: true, maxText: "10m", why: "a stop always allows some grace"},
	"approvalTimeoutSeconds":     {max: timeout.MaxApproval.Seconds(), above: true, maxText: "24h", why: "an unanswered question is always denied in the end"},
	"budgetWarningRatio":         {max: 1, below: true, zero: "off", why: "a share of the time limit"},
}

// Bounds of the other numeric keys, by key path (list elements as []).
var bounds = map[string]bound{
	"server.maxConnsPerIP":         {min: 1, max: 10000},
	"server.requestsPerSecond":     {above: true, max: 10000},
	"server.requestBurst":          {min: 1, max: 100000},
	"server.tickIntervalMs":        {min: 1000, max: 600000, maxText: "10m"},
	"server.maxPayloadBytes":       {min: 1, max: 64 << 20, maxText: "64 MiB"},
	"server.maxMessageChars":       {min: 1, max: 1000000},
	"server.sendQueue":             {min: 1, max: 65536},
	"server.idempotencyTTLSeconds": {above: true, max: 86400, maxText: "24h"},
	"server.historyLimit":          {min: 1, max: 10000},
	"server.maxSessions":           {min: 1, max: MaxSessionsLimit},
	"server.sessionIdleSeconds":    {above: true, max: SessionIdleSecondsLimit, maxText: "7 days"},
	"server.maxStuckRuns":          {min: 1, max: MaxStuckRunsLimit},
	"server.sendQueueBytes":        {min: 1, max: maxSendQueueBytes, maxText: "1 GiB"},
	"server.sendBufferBytes":       {min: 1, max: maxSendBufferBytes, maxText: "16 GiB"},
	"server.maxAnswerBytes":        {min: 1, max: maxAnswerBytes, maxText: "64 MiB"},

	"agents.openai.maxSteps":                        {min: 1, max: 100},
	"agents.openai.llmIdleTimeoutSeconds":           {above: true, max: 3600, maxText: "1h"},
	"agents.openai.tools.httpGet.maxBytes":          {min: 1, max: 64 << 20, maxText: "64 MiB"},
	"agents.openai.tools.httpGet.timeoutSeconds":    {above: true, max: 600, maxText: "10m"},
	"agents.openai.tools.commands[].timeoutSeconds": {max: 3600, zero: "the default", maxText: "1h"},
	"agents.openai.tools.commands[].maxOutputBytes": {max: 16 << 20, zero: "the default", maxText: "16 MiB"},

	"agents.acp.idleSeconds":         {above: true, max: 7 * 86400, maxText: "7 days"},
	"agents.acp.startTimeoutSeconds": {above: true, max: 600, maxText: "10m"},

	"agents.defaults.busy.maxQueued":        {max: MaxQueuedLimit, zero: "nothing waits"},
	"agents.defaults.resume.maxAttempts":    {min: 2, max: MaxResumeAttemptsLimit},
	"agents.defaults.resume.maxAgeSeconds":  {above: true, max: 7 * 86400, maxText: "7 days"},
	"channels.ws.busy.maxQueued":            {max: MaxQueuedLimit, zero: "nothing waits"},
	"channels.telegram.busy.maxQueued":      {max: MaxQueuedLimit, zero: "nothing waits"},
	"agents.defaults.busy.maxQueuedBytes":   {min: 1, max: MaxQueuedBytesLimit, maxText: "64 MiB"},
	"channels.ws.busy.maxQueuedBytes":       {min: 1, max: MaxQueuedBytesLimit, maxText: "64 MiB"},
	"channels.telegram.busy.maxQueuedBytes": {min: 1, max: MaxQueuedBytesLimit, maxText: "64 MiB"},
	"agents.defaults.busy.debounceMs":       {max: MaxDebounceMsLimit, zero: "off", maxText: "10 s"},
	"channels.ws.busy.debounceMs":           {max: MaxDebounceMsLimit, zero: "off", maxText: "10 s"},
	"channels.telegram.busy.debounceMs":     {max: MaxDebounceMsLimit, zero: "off", maxText: "10 s"},
	"channels.telegram.maxInputChars":       {min: 1, max: 1000000},
	"store.queueSize":                       {min: 1, max: 1 << 20},
	"store.retention.historyDays":           {max: 3650, zero: "kept forever"},
	"store.retention.maxMessagesPerSession": {max: 1_000_000, zero: "no cap"},
	"store.retention.journalDays":           {max: 3650, zero: "kept forever"},
	"store.retention.outboxDays":            {max: 3650, zero: "kept forever"},
	"store.retention.intervalMinutes":       {min: 1, max: 1440, maxText: "24h"},
	"store.retention.batchRows":             {min: 1, max: 10_000},
	"alerts.stepTimeoutBurst":               {min: 1, max: 10000},
	"cluster.leaseSeconds":                  {min: 1, max: 60, maxText: "1m"},
	"telemetry.sampleRatio":                 {min: 0, max: 1, zero: "no turn traced"},
	"alerts.window":                         {above: true, max: (24 * time.Hour).Seconds(), maxText: "24h"},
}

// MinTokenChars is the shortest token or secret accepted (server.token,
// server.operatorToken, channels.telegram.webhookSecret).
const MinTokenChars = 16

// wholeIn checks an integer key against its bound; name is the key in
// bounds, key the one reported (they differ for list elements).
func (p *problems) wholeIn(name, key string, v int) {
	b := bounds[name]
	if f := float64(v); f >= b.min && f <= b.max {
		return
	}
	from := strconv.FormatFloat(b.min, 'f', -1, 64)
	if b.zero != "" && b.min == 0 {
		from += " (" + b.zero + ")"
	}
	p.add(key, "must be a whole number from %s to %s, got %d", from, b, v)
}

// numberIn checks a number key against b.
func (p *problems) numberIn(key string, v float64, b bound) {
	if (v > b.min || (!b.above && v == b.min)) && (v < b.max || (!b.below && v == b.max)) {
		return
	}
	why := ""
	if b.why != "" {
		why = " (" + b.why + ")"
	}
	if b.above {
		p.add(key, "must be a number > %s and at most %s, got %s%s", strconv.FormatFloat(b.min, 'f', -1, 64), b, number(v), why)
		return
	}
	from := strconv.FormatFloat(b.min, 'f', -1, 64)
	if b.zero != "" && b.min == 0 {
		from += " (" + b.zero + ")"
	}
	to := "to"
	if b.below {
		to = "to below"
	}
	p.add(key, "must be a number from %s %s %s, got %s%s", from, to, b, number(v), why)
}

// number prints a configured number as written: 99999999, 0.5, 1e+308, NaN.
func number(v float64) string {
	if math.Abs(v) < 1e21 {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// token checks an optional secret without echoing it: at least
// MinTokenChars characters, none of them white space or control characters.
func (p *problems) token(key, v string) {
	if v == "" {
		return
	}
	ok := utf8.RuneCountInString(v) >= MinTokenChars && utf8.ValidString(v)
	for _, r := range v {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			ok = false
		}
	}
	if !ok {
		p.add(key, "must be at least %d characters with no spaces (generate one with: openssl rand -hex 24)", MinTokenChars)
	}
}

// httpURL checks an optional URL without echoing it (URLs can carry tokens).
// fallbacks checks agents.openai.fallbacks: at most MaxOpenAIFallbacks,
// each with an http(s) baseURL without credentials and a model. The
// problems never quote a URL (its query may hold a secret) nor a key.
func (p *problems) fallbacks(fbs []OpenAIFallback) {
	if len(fbs) > MaxOpenAIFallbacks {
		p.add("agents.openai.fallbacks", "lists %d providers; at most %d are tried", len(fbs), MaxOpenAIFallbacks)
	}
	for i, f := range fbs {
		key := fmt.Sprintf("agents.openai.fallbacks[%d]", i)
		switch u, err := url.Parse(f.BaseURL); {
		case f.BaseURL == "":
			p.add(key+".baseURL", "is required (e.g. http://127.0.0.1:11434/v1)")
		case err == nil && u.User != nil:
			p.add(key+".baseURL", "must not contain credentials; use %s.apiKey", key)
		default:
			p.httpURL(key+".baseURL", f.BaseURL)
		}
		if strings.TrimSpace(f.Model) == "" {
			p.add(key+".model", "is required")
		}
	}
}

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

// postgresURL checks a PostgreSQL connection URL, required when need. The
// problem never quotes the value: it holds a password.
func (p *problems) postgresURL(key, v string, need bool) {
	if v == "" {
		if need {
			p.add(key, `is required with store.driver "postgres" (postgres://user:password@host:5432/database)`)
		}
		return
	}
	u, err := url.Parse(v)
	switch {
	case err != nil || u.Host == "" || u.Opaque != "":
		p.add(key, "must be a URL of the form postgres://user:password@host:5432/database (the value is not shown: it may hold a password)")
	case u.Scheme != "postgres" && u.Scheme != "postgresql":
		p.add(key, "must be a postgres:// or postgresql:// URL")
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
	p.token("server.token", s.Token)
	if s.OperatorToken != s.Token { // Load copies server.token when unset
		p.token("server.operatorToken", s.OperatorToken)
	}
	for _, k := range []struct {
		name string
		v    int
	}{
		{"server.maxConnsPerIP", s.MaxConnsPerIP},
		{"server.requestBurst", s.RequestBurst},
		{"server.tickIntervalMs", s.TickIntervalMs},
		{"server.maxPayloadBytes", s.MaxPayloadBytes},
		{"server.maxMessageChars", s.MaxMessageChars},
		{"server.sendQueue", s.SendQueue},
		{"server.historyLimit", s.HistoryLimit},
		{"server.maxSessions", s.MaxSessions},
		{"server.maxStuckRuns", s.MaxStuckRuns},
	} {
		p.wholeIn(k.name, k.name, k.v)
	}
	p.numberIn("server.requestsPerSecond", s.RequestsPerSecond, bounds["server.requestsPerSecond"])
	p.numberIn("server.idempotencyTTLSeconds", s.IdempotencyTTLSeconds, bounds["server.idempotencyTTLSeconds"])
	p.numberIn("server.sessionIdleSeconds", s.SessionIdleSeconds, bounds["server.sessionIdleSeconds"])
	p.hostBounds(s)

	p.timeouts("agents.defaults", c.Agents.Defaults.Keys)
	p.timeouts("channels.ws.timeouts", c.Channels.WS.Timeouts)
	p.timeouts("channels.telegram.timeouts", c.Channels.Telegram.Timeouts)

	if r := c.Agents.Defaults.MaxReplyChars; r < 1 || r > MaxReplyCharsLimit {
		p.add("agents.defaults.maxReplyChars", "must be an integer from 1 to %d, got %d", MaxReplyCharsLimit, r)
	}

	p.busy("agents.defaults.busy", c.Agents.Defaults.Busy, false)
	p.wholeIn("agents.defaults.resume.maxAttempts", "agents.defaults.resume.maxAttempts", c.Agents.Defaults.Resume.MaxAttempts)
	p.numberIn("agents.defaults.resume.maxAgeSeconds", c.Agents.Defaults.Resume.MaxAgeSeconds, bounds["agents.defaults.resume.maxAgeSeconds"])
	p.busy("channels.ws.busy", c.Channels.WS.Busy, true)
	p.busy("channels.telegram.busy", c.Channels.Telegram.Busy, true)

	runners := []string{RunnerDemo, RunnerOpenAI, RunnerExec, RunnerACP}
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
	p.fallbacks(o.Fallbacks)
	p.wholeIn("agents.openai.maxSteps", "agents.openai.maxSteps", o.MaxSteps)
	p.numberIn("agents.openai.llmIdleTimeoutSeconds", o.LLMIdleTimeoutSeconds, bounds["agents.openai.llmIdleTimeoutSeconds"])
	h := o.Tools.HTTPGet
	p.wholeIn("agents.openai.tools.httpGet.maxBytes", "agents.openai.tools.httpGet.maxBytes", h.MaxBytes)
	p.numberIn("agents.openai.tools.httpGet.timeoutSeconds", h.TimeoutSeconds, bounds["agents.openai.tools.httpGet.timeoutSeconds"])
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
		p.numberIn(key+".timeoutSeconds", t.TimeoutSeconds, bounds["agents.openai.tools.commands[].timeoutSeconds"])
		p.wholeIn("agents.openai.tools.commands[].maxOutputBytes", key+".maxOutputBytes", t.MaxOutputBytes)
	}

	e := c.Agents.Exec
	if used[RunnerExec] && e.Command == "" {
		p.add("agents.exec.command", "is required when the exec runner is used")
	}
	p.oneOf("agents.exec.format", e.Format, ExecFormatJSONL, ExecFormatClaudeStreamJSON)
	if e.Permissions && e.Format == ExecFormatClaudeStreamJSON {
		p.add("agents.exec.permissions", "works with format jsonl only; Claude Code's permission prompts need the ACP runner (claude-code-acp)")
	}

	a := c.Agents.ACP
	if used[RunnerACP] && strings.TrimSpace(a.Command) == "" {
		p.add("agents.acp.command", "is required when the acp runner is used")
	}
	p.numberIn("agents.acp.idleSeconds", a.IdleSeconds, bounds["agents.acp.idleSeconds"])
	p.numberIn("agents.acp.startTimeoutSeconds", a.StartTimeoutSeconds, bounds["agents.acp.startTimeoutSeconds"])
	if m := a.AuthMethod; len(m) > 128 || !utf8.ValidString(m) || strings.ContainsFunc(m, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		p.add("agents.acp.authMethod", "must be an auth method id the agent lists in initialize's authMethods: at most 128 bytes, no spaces")
	}

	tg := c.Channels.Telegram
	p.oneOf("channels.telegram.mode", tg.Mode, TelegramPolling, TelegramWebhook)
	p.oneOf("channels.telegram.streaming", tg.Streaming, TelegramStreamDraft, TelegramStreamEdit, TelegramStreamOff)
	if tg.Enabled && tg.Token == "" {
		p.add("channels.telegram.token", "is required when channels.telegram.enabled is true")
	}
	if tg.Enabled && tg.Mode == TelegramWebhook && tg.WebhookSecret == "" {
		p.add("channels.telegram.webhookSecret", "is required in webhook mode")
	}
	if tg.WebhookSecret != "" && !webhookSecret.MatchString(tg.WebhookSecret) {
		p.add("channels.telegram.webhookSecret", "must be 1–256 characters of A-Z, a-z, 0-9, _ and -")
	} else {
		p.token("channels.telegram.webhookSecret", tg.WebhookSecret)
	}
	p.httpURL("channels.telegram.apiURL", tg.APIURL)
	if tg.APIURL == "" {
		p.add("channels.telegram.apiURL", "must not be empty")
	}
	p.httpURL("channels.telegram.webhookURL", tg.WebhookURL)
	p.wholeIn("channels.telegram.maxInputChars", "channels.telegram.maxInputChars", tg.MaxInputChars)

	p.oneOf("store.driver", c.Store.Driver, StoreSQLite, StorePostgres)
	if c.Store.Path == "" {
		p.add("store.path", `must not be empty (use ":memory:" for no file)`)
	}
	p.postgresURL("store.url", c.Store.URL, c.Store.Driver == StorePostgres)
	for _, k := range []struct {
		name string
		v    int
	}{
		{"store.queueSize", c.Store.QueueSize},
		{"store.retention.historyDays", c.Store.Retention.HistoryDays},
		{"store.retention.maxMessagesPerSession", c.Store.Retention.MaxMessagesPerSession},
		{"store.retention.journalDays", c.Store.Retention.JournalDays},
		{"store.retention.outboxDays", c.Store.Retention.OutboxDays},
		{"store.retention.intervalMinutes", c.Store.Retention.IntervalMinutes},
		{"store.retention.batchRows", c.Store.Retention.BatchRows},
	} {
		p.wholeIn(k.name, k.name, k.v)
	}

	p.cluster(c)

	p.wholeIn("alerts.stepTimeoutBurst", "alerts.stepTimeoutBurst", c.Alerts.StepTimeoutBurst)
	if w, b := c.Alerts.Window, bounds["alerts.window"]; w <= 0 || w.Seconds() > b.max {
		p.add("alerts.window", "must be a duration > 0 and at most %s, got %s", b.maxText, w)
	}
	p.httpURL("alerts.webhookURL", c.Alerts.WebhookURL)
	p.telemetry(c.Telemetry)

	// Each template on its own, so that every bad one is reported.
	bad := false
	for _, n := range slices.Sorted(maps.Keys(c.Messages)) {
		if _, err := messages.Parse(map[string]string{n: c.Messages[n]}); err != nil {
			p = append(p, Problem{Key: "messages." + n, Text: err.Error()})
			bad = true
		}
	}
	if bad {
		return nil, p
	}
	set, err := messages.Parse(c.Messages)
	if err != nil {
		key, _, _ := strings.Cut(err.Error(), ":")
		p = append(p, Problem{Key: key, Text: err.Error()})
	}
	return set, p
}

// timeouts checks one layer of timeout keys against timeoutBounds, and
// livenessResetOn. A negative value and a 0 where 0 cannot mean "disabled"
// (Resolve would turn it into the 0.1 s minimum, which is never what was
// meant) break the same rule and get the same sentence.
func (p *problems) timeouts(prefix string, k timeout.Keys) {
	v := reflect.ValueOf(k)
	for f := range v.Type().Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		b, bounded := timeoutBounds[name]
		if x, ok := v.FieldByIndex(f.Index).Interface().(*float64); bounded && ok && x != nil {
			p.numberIn(prefix+"."+name, *x, b)
		}
	}
	switch k.LivenessResetOn {
	case "", timeout.LivenessStep, timeout.LivenessActivity:
	default:
		p.add(prefix+".livenessResetOn", "must be %q or %q, got %q", timeout.LivenessStep, timeout.LivenessActivity, k.LivenessResetOn)
	}
}

// busy checks one layer of busy keys; a channel's (inherit) may leave them
// unset.
func (p *problems) busy(prefix string, b Busy, inherit bool) {
	if b.Mode != "" || !inherit {
		p.oneOf(prefix+".mode", b.Mode, BusyQueue, BusyCollect, BusySteer, BusyInterrupt, BusyReject)
	}
	if b.MaxQueued != nil {
		p.wholeIn(prefix+".maxQueued", prefix+".maxQueued", *b.MaxQueued)
	} else if !inherit {
		p.add(prefix+".maxQueued", "must be set (a whole number from 0 to %d)", MaxQueuedLimit)
	}
	if b.MaxQueuedBytes != nil {
		p.wholeIn(prefix+".maxQueuedBytes", prefix+".maxQueuedBytes", *b.MaxQueuedBytes)
	} else if !inherit {
		p.add(prefix+".maxQueuedBytes", "must be set (a whole number from 1 to %d)", MaxQueuedBytesLimit)
	}
	if b.Overflow != "" || !inherit {
		p.oneOf(prefix+".overflow", b.Overflow, OverflowReject, OverflowDropOld, OverflowDropNew)
	}
	if b.DebounceMs != nil {
		p.wholeIn(prefix+".debounceMs", prefix+".debounceMs", *b.DebounceMs)
	} else if !inherit {
		p.add(prefix+".debounceMs", "must be set (a whole number from 0 to %d)", MaxDebounceMsLimit)
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

// Upper bounds of the hostile-input limits (docs/security.md).
const (
	maxSendQueueBytes  = 1 << 30
	maxSendBufferBytes = 16 << 30
	maxAnswerBytes     = 64 << 20
	maxAllowedHosts    = 64
)

// hostBounds checks server.allowedHosts and the byte budgets of the
// WebSocket channel.
func (p *problems) hostBounds(s Server) {
	if len(s.AllowedHosts) > maxAllowedHosts {
		p.add("server.allowedHosts", "lists %d names; at most %d are allowed", len(s.AllowedHosts), maxAllowedHosts)
	}
	for i, h := range s.AllowedHosts {
		if h == "" || len(h) > 253 || strings.ContainsAny(h, " \t/:*@[]") {
			p.add(fmt.Sprintf("server.allowedHosts[%d]", i), "must be a host name without port, scheme or wildcard, such as gateway.lan, got %q", h)
		}
	}
	p.wholeIn("server.sendQueueBytes", "server.sendQueueBytes", s.SendQueueBytes)
	p.wholeIn("server.sendBufferBytes", "server.sendBufferBytes", s.SendBufferBytes)
	p.wholeIn("server.maxAnswerBytes", "server.maxAnswerBytes", s.MaxAnswerBytes)
	if s.MaxAnswerBytes > 0 && s.SendQueueBytes > 0 && s.MaxAnswerBytes > s.SendQueueBytes {
		p.add("server.maxAnswerBytes", "must not exceed server.sendQueueBytes (%d), got %d", s.SendQueueBytes, s.MaxAnswerBytes)
	}
	if s.SendQueueBytes > 0 && s.SendBufferBytes > 0 && s.SendQueueBytes > s.SendBufferBytes {
		p.add("server.sendQueueBytes", "must not exceed server.sendBufferBytes (%d), got %d", s.SendBufferBytes, s.SendQueueBytes)
	}
}

// cluster checks cluster.*: turned on, it needs the shared store and NATS.
func (p *problems) cluster(c *Config) {
	cl := c.Cluster
	p.numberIn("cluster.leaseSeconds", cl.LeaseSeconds, bounds["cluster.leaseSeconds"])
	if len(cl.ReplicaID) > 64 || strings.ContainsFunc(cl.ReplicaID, func(r rune) bool {
		return !(r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}) {
		p.add("cluster.replicaID", "must be at most 64 letters, digits, '-', '_' or '.'")
	}
	for i, u := range cl.NATS.URLs {
		pu, err := url.Parse(u)
		if err != nil || pu.Host == "" || (pu.Scheme != "nats" && pu.Scheme != "tls" && pu.Scheme != "ws" && pu.Scheme != "wss") {
			p.add(fmt.Sprintf("cluster.nats.urls[%d]", i), "must be a nats://, tls://, ws:// or wss:// URL with a host, got %q", redactURL(u))
		}
	}
	n := cl.NATS
	if kinds := nonEmpty(n.CredsFile, n.NKeySeedFile, n.User); kinds > 1 {
		p.add("cluster.nats.credsFile", "takes one kind of credentials: credsFile, nkeySeedFile, or user and password")
	}
	if (n.User == "") != (n.Password == "") {
		p.add("cluster.nats.password", "goes with cluster.nats.user: set both or neither")
	}
	if (n.TLS.CertFile == "") != (n.TLS.KeyFile == "") {
		p.add("cluster.nats.tls.keyFile", "goes with cluster.nats.tls.certFile: set both or neither")
	}
	if cl.Secret != "" && cl.SecretFile != "" {
		p.add("cluster.secretFile", "is set together with cluster.secret: set one")
	}
	if cl.Secret != "" && len(strings.TrimSpace(cl.Secret)) < MinClusterSecretBytes {
		p.add("cluster.secret", "must be at least %d bytes (e.g. openssl rand -hex 32)", MinClusterSecretBytes)
	}
	if !cl.Enabled {
		return
	}
	if c.Store.Driver != StorePostgres {
		p.add("cluster.enabled", "needs store.driver: postgres (the replicas share one database), got %q", c.Store.Driver)
	}
	if len(cl.NATS.URLs) == 0 {
		p.add("cluster.enabled", "needs cluster.nats.urls (the replicas' live events and aborts go through NATS)")
	}
	if !n.HasCredentials() && !n.InsecureTrustedNetwork {
		p.add("cluster.nats", "has no credentials, and cluster.enabled needs them (credsFile, nkeySeedFile, or user and password): "+
			"without them anyone who can reach NATS can act as a replica. On a private network where every process that can reach NATS is trusted, "+
			"set cluster.nats.insecureTrustedNetwork: true instead")
	}
	if cl.Secret == "" && cl.SecretFile == "" {
		p.add("cluster.secret", "is required with cluster.enabled (or cluster.secretFile): at least %d bytes, the same on every replica, "+
			"which sign what they send each other with it", MinClusterSecretBytes)
	}
}

// MinClusterSecretBytes is the shortest cluster.secret accepted.
const MinClusterSecretBytes = 32

// nonEmpty counts the non-empty strings of ss.
func nonEmpty(ss ...string) int {
	n := 0
	for _, s := range ss {
		if s != "" {
			n++
		}
	}
	return n
}

// ClusterSecret is cluster.secret, or the contents of cluster.secretFile
// without surrounding white space; an error names the file, never the
// secret, and refuses one shorter than MinClusterSecretBytes.
func (cl Cluster) ClusterSecret() ([]byte, error) {
	s := cl.Secret
	if cl.SecretFile != "" {
		b, err := os.ReadFile(cl.SecretFile)
		if err != nil {
			return nil, fmt.Errorf("cluster.secretFile: %w", err)
		}
		s = string(b)
	}
	s = strings.TrimSpace(s)
	if len(s) < MinClusterSecretBytes {
		return nil, fmt.Errorf("the cluster secret (cluster.secret or cluster.secretFile) has %d bytes, fewer than %d", len(s), MinClusterSecretBytes)
	}
	return []byte(s), nil
}

// telemetry checks telemetry.*. A problem never quotes a header value: it
// is a secret.
func (p *problems) telemetry(t Telemetry) {
	p.numberIn("telemetry.sampleRatio", t.SampleRatio, bounds["telemetry.sampleRatio"])
	if t.ServiceName == "" || len(t.ServiceName) > 255 {
		p.add("telemetry.serviceName", "must be 1 to 255 characters")
	}
	o := t.OTLP
	if o.Protocol != OTLPGRPC && o.Protocol != OTLPHTTP {
		p.add("telemetry.otlp.protocol", "must be grpc or http, got %q", o.Protocol)
	}
	if e := o.Endpoint; e != "" {
		if strings.Contains(e, "://") {
			u, err := url.Parse(e)
			if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
				p.add("telemetry.otlp.endpoint", "must be host:port or an http:// or https:// URL with a host, got %q", redactEndpoint(e))
			}
		} else if host, port, err := net.SplitHostPort(e); err != nil || host == "" || !validPort(port) {
			p.add("telemetry.otlp.endpoint", "must be host:port or an http:// or https:// URL with a host, got %q", redactEndpoint(e))
		}
	}
	for k := range o.Headers {
		if k == "" || strings.ContainsAny(k, " \t\r\n:") {
			p.add("telemetry.otlp.headers", "has an invalid header name %q", k)
		}
	}
}

// validPort reports whether s is a port number from 1 to 65535.
func validPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 1 && n <= 65535
}
