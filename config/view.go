package config

import (
	"maps"
	"net"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/timeout"
)

// Redaction replaces every non-empty secret in Redacted and String.
const Redaction = "[redacted]"

// MessageSet returns the message templates, parsed once at load. For a
// Config not made by Load it parses Messages on each call and falls back to
// the built-in texts if they do not parse (Validate reports why).
func (c *Config) MessageSet() *messages.Set {
	if c.msgs != nil {
		return c.msgs
	}
	if s, err := messages.Parse(c.Messages); err == nil {
		return s
	}
	return messages.MustDefault()
}

// TurnSettings returns the effective limits of a turn on channel ("ws" or
// "telegram"; any other name gets agents.defaults alone): request (the
// per-request wall clock override, 0 = none) over
// channels.<channel>.timeouts over agents.defaults over the built-in
// defaults, clamped as timeout.Resolve documents.
func (c *Config) TurnSettings(channel string, request time.Duration) timeout.Settings {
	layers := make([]timeout.Keys, 0, 2)
	switch channel {
	case ChannelWS:
		layers = append(layers, c.Channels.WS.Timeouts)
	case ChannelTelegram:
		layers = append(layers, c.Channels.Telegram.Timeouts)
	}
	layers = append(layers, c.Agents.Defaults.Keys)
	return timeout.Resolve(request, layers...)
}

// RunnerFor returns the runner name for a turn on channel: the channel's
// runner override if set, else agents.defaults.runner.
func (c *Config) RunnerFor(channel string) string {
	var r string
	switch channel {
	case ChannelWS:
		r = c.Channels.WS.Runner
	case ChannelTelegram:
		r = c.Channels.Telegram.Runner
	}
	if r != "" {
		return r
	}
	return c.Agents.Defaults.Runner
}

// BusyFor returns the busy mode and the per-session queue bound of a turn
// on channel: each of channels.<channel>.busy's keys when set, else
// agents.defaults.busy's, else the built-in queue and 5.
func (c *Config) BusyFor(channel string) (mode string, maxQueued int) {
	mode, maxQueued = BusyQueue, defaultMaxQueued
	for _, b := range c.busyLayers(channel) {
		if b.Mode != "" {
			mode = b.Mode
		}
		if b.MaxQueued != nil {
			maxQueued = *b.MaxQueued
		}
	}
	return mode, maxQueued
}

// OverflowFor returns busy.overflow of a turn on channel:
// channels.<channel>.busy's when set, else agents.defaults.busy's, else
// the built-in reject.
func (c *Config) OverflowFor(channel string) string {
	o := OverflowReject
	for _, b := range c.busyLayers(channel) {
		if b.Overflow != "" {
			o = b.Overflow
		}
	}
	return o
}

// DebounceFor returns busy.debounceMs of a turn on channel as a duration:
// channels.<channel>.busy's when set, else agents.defaults.busy's, else 0
// (off).
func (c *Config) DebounceFor(channel string) time.Duration {
	ms := 0
	for _, b := range c.busyLayers(channel) {
		if b.DebounceMs != nil {
			ms = *b.DebounceMs
		}
	}
	return time.Duration(ms) * time.Millisecond
}

// defaultMaxQueued is busy.maxQueued's built-in value.
const defaultMaxQueued = 5

// QueuedBytesFor returns the per-session byte budget of waiting text
// (busy.maxQueuedBytes) of a turn on channel: channels.<channel>.busy's
// when set, else agents.defaults.busy's, else the built-in 1 MiB.
func (c *Config) QueuedBytesFor(channel string) int {
	n := defaultMaxQueuedBytes
	for _, b := range c.busyLayers(channel) {
		if b.MaxQueuedBytes != nil {
			n = *b.MaxQueuedBytes
		}
	}
	return n
}

// busyLayers are the busy keys that apply on channel, the later overriding
// the earlier key by key: agents.defaults.busy, then the channel's.
func (c *Config) busyLayers(channel string) []Busy {
	layers := []Busy{c.Agents.Defaults.Busy}
	switch channel {
	case ChannelWS:
		layers = append(layers, c.Channels.WS.Busy)
	case ChannelTelegram:
		layers = append(layers, c.Channels.Telegram.Busy)
	}
	return layers
}

// defaultMaxQueuedBytes is busy.maxQueuedBytes's built-in value (1 MiB).
const defaultMaxQueuedBytes = 1 << 20

// Redacted returns a deep copy of c in which every non-empty secret is
// replaced by Redaction: server.token, server.operatorToken,
// agents.openai.apiKey and each of agents.openai.fallbacks, channels.telegram.token,
// channels.telegram.webhookSecret and the values of agents.exec.env and
// agents.acp.env and telemetry.otlp.headers. In
// URLs (agents.openai.baseURL and the fallbacks', channels.telegram.apiURL and webhookURL,
// alerts.webhookURL, telemetry.otlp.endpoint) the user info, query string and fragment are
// replaced; in store.url (which holds the database password) too. c is not
// modified.
func (c *Config) Redacted() Config {
	r := *c
	r.Messages = maps.Clone(c.Messages)
	r.Alerts.TelegramChatIDs = slices.Clone(c.Alerts.TelegramChatIDs)

	r.Server.Token = redact(c.Server.Token)
	r.Server.OperatorToken = redact(c.Server.OperatorToken)

	r.Agents.Defaults.Keys = cloneKeys(c.Agents.Defaults.Keys)
	r.Agents.Defaults.Busy = cloneBusy(c.Agents.Defaults.Busy)
	r.Channels.WS.Busy = cloneBusy(c.Channels.WS.Busy)
	r.Channels.Telegram.Busy = cloneBusy(c.Channels.Telegram.Busy)
	o := &r.Agents.OpenAI
	o.APIKey = redact(o.APIKey)
	o.BaseURL = redactURL(o.BaseURL)
	o.Fallbacks = slices.Clone(o.Fallbacks)
	for i := range o.Fallbacks {
		o.Fallbacks[i].APIKey = redact(o.Fallbacks[i].APIKey)
		o.Fallbacks[i].BaseURL = redactURL(o.Fallbacks[i].BaseURL)
	}
	o.Tools.HTTPGet.Allow = slices.Clone(o.Tools.HTTPGet.Allow)
	o.Tools.Commands = slices.Clone(o.Tools.Commands)
	for i := range o.Tools.Commands {
		cmd := &o.Tools.Commands[i]
		cmd.Argv = slices.Clone(cmd.Argv)
		cmd.Parameters, _ = deepCopy(cmd.Parameters).(map[string]any)
	}
	r.Agents.Exec.Args = slices.Clone(c.Agents.Exec.Args)
	if c.Agents.Exec.Env != nil {
		r.Agents.Exec.Env = make(map[string]string, len(c.Agents.Exec.Env))
		for k, v := range c.Agents.Exec.Env {
			r.Agents.Exec.Env[k] = redact(v)
		}
	}

	r.Agents.ACP.Args = slices.Clone(c.Agents.ACP.Args)
	if c.Agents.ACP.Env != nil {
		r.Agents.ACP.Env = make(map[string]string, len(c.Agents.ACP.Env))
		for k, v := range c.Agents.ACP.Env {
			r.Agents.ACP.Env[k] = redact(v)
		}
	}

	r.Channels.WS.Timeouts = cloneKeys(c.Channels.WS.Timeouts)
	tg := &r.Channels.Telegram
	tg.Timeouts = cloneKeys(tg.Timeouts)
	tg.Token = redact(tg.Token)
	tg.WebhookSecret = redact(tg.WebhookSecret)
	tg.APIURL = redactURL(tg.APIURL)
	tg.WebhookURL = redactURL(tg.WebhookURL)
	tg.AllowedChatIDs = slices.Clone(tg.AllowedChatIDs)

	r.Alerts.WebhookURL = redactURL(c.Alerts.WebhookURL)
	r.Telemetry.OTLP.Endpoint = redactEndpoint(c.Telemetry.OTLP.Endpoint)
	if c.Telemetry.OTLP.Headers != nil {
		r.Telemetry.OTLP.Headers = make(map[string]string, len(c.Telemetry.OTLP.Headers))
		for k, v := range c.Telemetry.OTLP.Headers {
			r.Telemetry.OTLP.Headers[k] = redact(v)
		}
	}
	r.Store.URL = redactURL(c.Store.URL)
	r.Cluster.Secret = redact(c.Cluster.Secret)
	r.Cluster.NATS.Password = redact(c.Cluster.NATS.Password)
	if len(c.Cluster.NATS.URLs) > 0 {
		r.Cluster.NATS.URLs = make([]string, len(c.Cluster.NATS.URLs))
		for i, u := range c.Cluster.NATS.URLs {
			r.Cluster.NATS.URLs[i] = redactURL(u)
		}
	}
	return r
}

// Secrets returns the non-empty secret values of c (those Redacted
// replaces, URL credentials aside — except the password of store.url and
// of cluster.nats.urls, and a NATS URL's token), for
// redacting them from free text such as a runner's error.
func (c *Config) Secrets() []string {
	out := []string{c.Server.Token, c.Server.OperatorToken, c.Agents.OpenAI.APIKey,
		c.Channels.Telegram.Token, c.Channels.Telegram.WebhookSecret, c.Cluster.Secret, c.Cluster.NATS.Password}
	for _, f := range c.Agents.OpenAI.Fallbacks {
		out = append(out, f.APIKey)
	}
	for _, v := range c.Agents.Exec.Env {
		out = append(out, v)
	}
	for _, v := range c.Agents.ACP.Env {
		out = append(out, v)
	}
	for _, v := range c.Telemetry.OTLP.Headers {
		out = append(out, v)
	}
	for i, raw := range append([]string{c.Store.URL}, c.Cluster.NATS.URLs...) {
		if u, err := url.Parse(raw); err == nil && u.User != nil {
			pw, ok := u.User.Password()
			out = append(out, pw)
			if !ok && i > 0 {
				out = append(out, u.User.Username()) // nats://TOKEN@host: the user part is the token
			}
		}
	}
	return slices.DeleteFunc(out, func(s string) bool { return s == "" })
}

// String renders c as YAML in the shape of the configuration file, with
// every secret redacted (see Redacted), so printing a Config or *Config with
// %v or %s, or logging it, never reveals a secret.
func (c Config) String() string {
	r := c.Redacted()
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(toPlain(reflect.ValueOf(r))); err != nil {
		return "config: " + err.Error()
	}
	_ = enc.Close()
	return b.String()
}

// GoString is String, so that %#v is as safe as %v.
func (c Config) GoString() string { return c.String() }

func redact(s string) string {
	if s == "" {
		return ""
	}
	return Redaction
}

// redactURL keeps the scheme, host and path of a URL and replaces user
// info, query and fragment; a URL that does not parse is redacted whole.
// redactEndpoint is redactURL for a URL, and a host:port as it is (it holds
// no secret).
func redactEndpoint(s string) string {
	if !strings.Contains(s, "://") {
		if _, _, err := net.SplitHostPort(s); err == nil {
			return s
		}
	}
	return redactURL(s)
}

func redactURL(s string) string {
	if s == "" {
		return ""
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.Opaque != "" {
		return Redaction
	}
	var b strings.Builder
	b.WriteString(u.Scheme + "://")
	if u.User != nil {
		b.WriteString(Redaction + "@")
	}
	b.WriteString(u.Host + u.EscapedPath())
	if u.RawQuery != "" || u.ForceQuery {
		b.WriteString("?" + Redaction)
	}
	if u.Fragment != "" {
		b.WriteString("#" + Redaction)
	}
	return b.String()
}

func cloneBusy(b Busy) Busy {
	if b.MaxQueued != nil {
		n := *b.MaxQueued
		b.MaxQueued = &n
	}
	if b.MaxQueuedBytes != nil {
		n := *b.MaxQueuedBytes
		b.MaxQueuedBytes = &n
	}
	if b.DebounceMs != nil {
		n := *b.DebounceMs
		b.DebounceMs = &n
	}
	return b
}

func cloneKeys(k timeout.Keys) timeout.Keys {
	clone := func(p *float64) *float64 {
		if p == nil {
			return nil
		}
		v := *p
		return &v
	}
	k.TimeoutSeconds = clone(k.TimeoutSeconds)
	k.StepTimeoutSeconds = clone(k.StepTimeoutSeconds)
	k.MaxTurnTimeSeconds = clone(k.MaxTurnTimeSeconds)
	k.ProgressNotifyAfterSeconds = clone(k.ProgressNotifyAfterSeconds)
	k.ProgressRepeatSeconds = clone(k.ProgressRepeatSeconds)
	k.AbortGraceSeconds = clone(k.AbortGraceSeconds)
	return k
}

// deepCopy copies the maps and slices of a decoded YAML value.
func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		if v == nil {
			return v
		}
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[k] = deepCopy(e)
		}
		return m
	case map[any]any:
		m := make(map[any]any, len(v))
		for k, e := range v {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		s := make([]any, len(v))
		for i, e := range v {
			s[i] = deepCopy(e)
		}
		return s
	}
	return v
}
