package config

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/knadh/koanf/v2"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/timeout"
)

func TestTurnSettings(t *testing.T) {
	// testdata/precedence.yaml: agents.defaults timeoutSeconds 600,
	// stepTimeoutSeconds 60; channels.ws.timeouts progressNotifyAfterSeconds 5.
	env := []string{
		"GATEWAY_CHANNELS__TELEGRAM__TIMEOUTS__STEPTIMEOUTSECONDS=30",
		"GATEWAY_CHANNELS__TELEGRAM__TIMEOUTS__MAXTURNTIMESECONDS=900",
		"GATEWAY_CHANNELS__TELEGRAM__TIMEOUTS__BUDGETWARNINGRATIO=0.5",
	}
	c := mustLoad(t, "testdata/precedence.yaml", env...)
	def := timeout.Defaults()
	tests := []struct {
		name    string
		channel string
		request time.Duration
		want    timeout.Settings
	}{
		{"ws: channel layer over defaults", "ws", 0, timeout.Settings{
			Timeout: 600 * time.Second, StepTimeout: 60 * time.Second, MaxTurnTime: def.MaxTurnTime,
			ProgressNotifyAfter: 5 * time.Second, ProgressRepeat: def.ProgressRepeat, AbortGrace: def.AbortGrace, ApprovalTimeout: def.ApprovalTimeout,
			LivenessResetOn: timeout.LivenessStep, BudgetWarningRatio: def.BudgetWarningRatio}},
		{"telegram: its own layer, not ws's", "telegram", 0, timeout.Settings{
			Timeout: 600 * time.Second, StepTimeout: 30 * time.Second, MaxTurnTime: 900 * time.Second,
			ProgressNotifyAfter: def.ProgressNotifyAfter, ProgressRepeat: def.ProgressRepeat, AbortGrace: def.AbortGrace, ApprovalTimeout: def.ApprovalTimeout,
			LivenessResetOn: timeout.LivenessStep, BudgetWarningRatio: 0.5}},
		{"unknown channel: agents.defaults only", "cli", 0, timeout.Settings{
			Timeout: 600 * time.Second, StepTimeout: 60 * time.Second, MaxTurnTime: def.MaxTurnTime,
			ProgressNotifyAfter: def.ProgressNotifyAfter, ProgressRepeat: def.ProgressRepeat, AbortGrace: def.AbortGrace, ApprovalTimeout: def.ApprovalTimeout,
			LivenessResetOn: timeout.LivenessStep, BudgetWarningRatio: def.BudgetWarningRatio}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eq(t, "settings", c.TurnSettings(tt.channel, tt.request), tt.want)
		})
	}

	// The per-request override replaces only the wall clock, shorter or
	// longer, and never past the channel's ceiling.
	for _, tt := range []struct {
		channel string
		request time.Duration
		want    time.Duration
	}{
		{"ws", 20 * time.Second, 20 * time.Second},
		{"ws", 45 * time.Minute, 45 * time.Minute},
		{"ws", 5 * time.Hour, time.Hour},                  // agents.defaults ceiling (built-in 3600 s)
		{"telegram", 20 * time.Minute, 900 * time.Second}, // telegram's ceiling
		{"telegram", time.Millisecond, timeout.Min},
		{"ws", -time.Second, timeout.Min},
	} {
		t.Run(fmt.Sprintf("request %s on %s", tt.request, tt.channel), func(t *testing.T) {
			s := c.TurnSettings(tt.channel, tt.request)
			eq(t, "timeout", s.Timeout, tt.want)
			eq(t, "stepTimeout unchanged", s.StepTimeout, c.TurnSettings(tt.channel, 0).StepTimeout)
		})
	}
}

func TestRunnerFor(t *testing.T) {
	c := Default()
	eq(t, "default", c.RunnerFor("ws"), "demo")
	c.Agents.Defaults.Runner = "openai"
	c.Channels.Telegram.Runner = "exec"
	eq(t, "ws follows agents.defaults", c.RunnerFor("ws"), "openai")
	eq(t, "telegram override", c.RunnerFor("telegram"), "exec")
	eq(t, "other channel", c.RunnerFor("cli"), "openai")
	c.Channels.WS.Runner = "demo"
	eq(t, "ws override", c.RunnerFor("ws"), "demo")
}

func TestMessageSet(t *testing.T) {
	f := messages.Fields{Elapsed: messages.Duration(2 * time.Second), CurrentStep: "shell"}
	// A Config built in code (not loaded) still gets its overrides…
	c := &Config{Messages: map[string]string{"user": "halted {{.Elapsed}}"}}
	eq(t, "override", c.MessageSet().Render(messages.User, f), "halted 2 s")
	// …and the defaults when they do not parse.
	c.Messages["user"] = "{{"
	eq(t, "fallback", c.MessageSet().Render(messages.User, f), messages.MustDefault().Render(messages.User, f))
	// A loaded Config parses once, at load.
	l := Default()
	if l.MessageSet() != l.MessageSet() {
		t.Error("MessageSet of a loaded config is parsed again on each call")
	}
}

// The secrets of testdata/valid/full.yaml.
var fullSecrets = []string{
	"example-client-token", "example-operator-token", "sk-example-api-key", "example-exec-secret",
	"example-telegram-token", "example_webhook_secret", "example-alert-secret", "example-otlp-secret",
	"example-fallback-key", "example-fallback-query",
}

func TestRedactedAndStringHideSecrets(t *testing.T) {
	c := mustLoad(t, "testdata/valid/full.yaml",
		"GATEWAY_AGENTS__OPENAI__BASEURL=https://user:example-url-password@llm.example/v1?token=example-url-query#example-frag",
		"GATEWAY_STORE__URL=postgres://turnguard:example-db-password@db.example:5432/turnguard?sslmode=require&password=example-db-query")
	secrets := append(fullSecrets, "example-url-password", "example-url-query", "example-frag", "example-db-password",
		"example-db-query")

	r := c.Redacted()
	eq(t, "server.token", r.Server.Token, Redaction)
	eq(t, "server.operatorToken", r.Server.OperatorToken, Redaction)
	eq(t, "agents.openai.apiKey", r.Agents.OpenAI.APIKey, Redaction)
	eq(t, "agents.openai.fallbacks", r.Agents.OpenAI.Fallbacks, []OpenAIFallback{
		{BaseURL: "https://fallback.example/v1?" + Redaction, APIKey: Redaction, Model: "fallback-model"}})
	if !slices.Contains(c.Secrets(), "example-fallback-key") {
		t.Errorf("Secrets() = %q lacks the fallback's API key", c.Secrets())
	}
	eq(t, "channels.telegram.token", r.Channels.Telegram.Token, Redaction)
	eq(t, "channels.telegram.webhookSecret", r.Channels.Telegram.WebhookSecret, Redaction)
	eq(t, "agents.exec.env", r.Agents.Exec.Env, map[string]string{"MY_AGENT_TOKEN": Redaction})
	eq(t, "alerts.webhookURL", r.Alerts.WebhookURL, "https://hooks.example.com/turnguard?"+Redaction)
	eq(t, "agents.openai.baseURL", r.Agents.OpenAI.BaseURL, "https://"+Redaction+"@llm.example/v1?"+Redaction+"#"+Redaction)
	eq(t, "store.url", r.Store.URL, "postgres://"+Redaction+"@db.example:5432/turnguard?"+Redaction)
	if !slices.Contains(c.Secrets(), "example-db-password") {
		t.Errorf("Secrets() = %q lacks the database password", c.Secrets())
	}
	eq(t, "non-secret kept", r.Channels.Telegram.WebhookURL, "https://bot.example.com/telegram/webhook")
	eq(t, "non-secret kept", r.Server.Listen, c.Server.Listen)

	// The original is untouched, and the copy is deep.
	eq(t, "original token", c.Server.Token, "example-client-token")
	eq(t, "original env", c.Agents.Exec.Env["MY_AGENT_TOKEN"], "example-exec-secret")
	eq(t, "original fallback key", c.Agents.OpenAI.Fallbacks[0].APIKey, "example-fallback-key")
	r.Channels.Telegram.AllowedChatIDs[0] = 1
	r.Agents.OpenAI.Tools.Commands[0].Parameters["type"] = "changed"
	*r.Channels.WS.Timeouts.StepTimeoutSeconds = 1
	r.Messages["stepTimeout"] = "changed"
	eq(t, "original chat ids", c.Channels.Telegram.AllowedChatIDs[0], int64(123456789))
	eq(t, "original parameters", c.Agents.OpenAI.Tools.Commands[0].Parameters["type"], any("object"))
	eq(t, "original timeouts", *c.Channels.WS.Timeouts.StepTimeoutSeconds, 600.0)
	if c.Messages["stepTimeout"] == "changed" {
		t.Error("Redacted shares the messages map")
	}

	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("loaded", "config", c)
	for name, out := range map[string]string{
		"String":        c.String(),
		"%v of *Config": fmt.Sprintf("%v", c),
		"%s of Config":  fmt.Sprintf("%s", *c),
		"%+v":           fmt.Sprintf("%+v", c),
		"%#v":           fmt.Sprintf("%#v", *c),
		"slog":          logged.String(),
	} {
		for _, s := range secrets {
			if strings.Contains(out, s) {
				t.Errorf("%s contains the secret %q:\n%s", name, s, out)
			}
		}
		if !strings.Contains(out, Redaction) {
			t.Errorf("%s shows no redaction:\n%s", name, out)
		}
	}
	// Empty secrets stay empty, so "not set" is visible.
	d := Default().Redacted()
	eq(t, "unset token", d.Server.Token, "")
}

// TestStringGolden pins the printed form of the full example: the shape of
// the YAML file, secrets redacted. Regenerate with -update.
func TestStringGolden(t *testing.T) {
	c := mustLoad(t, "testdata/valid/full.yaml")
	got := c.String()
	matchGolden(t, "testdata/full.golden", got)
	// What String prints has the keys of the configuration file: it decodes
	// with no unknown key and no type error.
	k := koanf.New(".")
	if err := k.Load(bytesProvider(got), yamlParser{}); err != nil {
		t.Fatal(err)
	}
	if probs := decode(k, new(Config)); len(probs) > 0 {
		t.Errorf("the printed config does not decode: %v", probs)
	}
}
