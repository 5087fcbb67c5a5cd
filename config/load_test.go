package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/knadh/koanf/providers/file"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/timeout"
)

var update = flag.Bool("update", false, "rewrite golden files")

// loadFile loads a fixture as Load does, with the given environment instead
// of the process's.
func loadFile(t *testing.T, path string, environ ...string) (*Config, error) {
	t.Helper()
	if path != "" {
		return load(path, file.Provider(path), environ)
	}
	return load("", nil, environ)
}

func mustLoad(t *testing.T, path string, environ ...string) *Config {
	t.Helper()
	c, err := loadFile(t, path, environ...)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	return c
}

func TestDefaults(t *testing.T) {
	c := Default()
	five, mib, zero := 5, 1<<20, 0
	want := Config{
		Server: Server{
			Listen: "127.0.0.1:18789", MaxConnsPerIP: 64, RequestsPerSecond: 50, RequestBurst: 100,
			TickIntervalMs: 30000, MaxPayloadBytes: 1 << 20, MaxMessageChars: 100000, SendQueue: 256,
			SendQueueBytes: 8 << 20, SendBufferBytes: 64 << 20, MaxAnswerBytes: 1 << 20,
			IdempotencyTTLSeconds: 300, HistoryLimit: 200,
			MaxSessions: 10000, SessionIdleSeconds: 3600, MaxStuckRuns: 16,
		},
		Agents: Agents{
			Defaults: AgentDefaults{Runner: "demo", MaxReplyChars: 100000, Busy: Busy{Mode: "queue", MaxQueued: &five, MaxQueuedBytes: &mib},
				Resume: Resume{MaxAttempts: 3, MaxAgeSeconds: 3600}},
			OpenAI: OpenAI{MaxSteps: 8, LLMIdleTimeoutSeconds: 120,
				Tools: OpenAITools{HTTPGet: HTTPGetTool{MaxBytes: 1 << 20, TimeoutSeconds: 20}}},
			Exec: Exec{Format: "jsonl"},
			ACP:  ACP{IdleSeconds: 1800, StartTimeoutSeconds: 60},
		},
		Channels: Channels{Telegram: Telegram{APIURL: "https://api.telegram.org", Mode: "polling", MaxInputChars: 8000, Streaming: "draft"}},
		Watchdog: Watchdog{Enabled: true, AutoAbort: true},
		Store: Store{Driver: StoreSQLite, Path: "turnguard.db", QueueSize: 4096, Retention: StoreRetention{
			HistoryDays: 90, MaxMessagesPerSession: 5000, JournalDays: 30, OutboxDays: 7, IntervalMinutes: 60, BatchRows: 500}},
		Cluster:   Cluster{LeaseSeconds: 3, NATS: ClusterNATS{URLs: []string{}}},
		Alerts:    Alerts{StepTimeoutBurst: 5, Window: 10 * time.Minute},
		Telemetry: Telemetry{ServiceName: "turnguard", SampleRatio: 1, OTLP: TelemetryOTLP{Protocol: OTLPGRPC}},
	}
	want.Agents.Defaults.Busy.Overflow, want.Agents.Defaults.Busy.DebounceMs = OverflowReject, &zero // issue 23
	got := *c
	got.msgs = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("defaults:\n got %s\nwant %s", got.String(), want.String())
	}
	if err := c.Validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
	// Timeout keys are unset, so a turn gets timeout's own built-in defaults.
	if got, want := c.TurnSettings("ws", 0), timeout.Defaults(); got != want {
		t.Errorf("TurnSettings of defaults = %+v, want %+v", got, want)
	}
	// No file and no environment: Load("") is the defaults.
	l, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	l.msgs = nil
	if !reflect.DeepEqual(*l, want) {
		t.Errorf(`Load("") differs from the defaults: %s`, l)
	}
}

func TestPrecedence(t *testing.T) {
	const path = "testdata/precedence.yaml"
	tests := []struct {
		name    string
		environ []string
		check   func(t *testing.T, c *Config)
	}{
		{"file over defaults", nil, func(t *testing.T, c *Config) {
			eq(t, "server.maxConnsPerIP", c.Server.MaxConnsPerIP, 10) // file
			eq(t, "server.historyLimit", c.Server.HistoryLimit, 50)   // file
			eq(t, "server.sendQueue", c.Server.SendQueue, 256)        // default
			eq(t, "stepTimeoutSeconds", *c.Agents.Defaults.StepTimeoutSeconds, 60.0)
			eq(t, "allowedChatIDs", c.Channels.Telegram.AllowedChatIDs, []int64{1, 2, 3})
		}},
		{"environment over file", []string{
			"GATEWAY_SERVER__HISTORYLIMIT=70",
			"GATEWAY_AGENTS__DEFAULTS__STEPTIMEOUTSECONDS=120",
			"GATEWAY_CHANNELS__TELEGRAM__ALLOWEDCHATIDS=7",
		}, func(t *testing.T, c *Config) {
			eq(t, "server.maxConnsPerIP", c.Server.MaxConnsPerIP, 10) // file
			eq(t, "server.historyLimit", c.Server.HistoryLimit, 70)   // env
			eq(t, "server.sendQueue", c.Server.SendQueue, 256)        // default
			eq(t, "stepTimeoutSeconds", *c.Agents.Defaults.StepTimeoutSeconds, 120.0)
			eq(t, "allowedChatIDs (a list is replaced, not merged)", c.Channels.Telegram.AllowedChatIDs, []int64{7})
		}},
		{"environment over defaults", []string{"GATEWAY_SERVER__SENDQUEUE=9"}, func(t *testing.T, c *Config) {
			eq(t, "server.sendQueue", c.Server.SendQueue, 9)
		}},
		{"empty environment value unsets an optional timeout key", []string{
			"GATEWAY_AGENTS__DEFAULTS__TIMEOUTSECONDS=",
		}, func(t *testing.T, c *Config) {
			if c.Agents.Defaults.TimeoutSeconds != nil {
				t.Errorf("timeoutSeconds = %v, want unset", *c.Agents.Defaults.TimeoutSeconds)
			}
			eq(t, "wall clock", c.TurnSettings("ws", 0).Timeout, timeout.DefaultTimeoutSeconds*time.Second)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.check(t, mustLoad(t, path, tt.environ...))
		})
	}
}

// TestLoadReadsProcessEnvironment goes through the public Load, which reads
// os.Environ.
func TestLoadReadsProcessEnvironment(t *testing.T) {
	t.Setenv("GATEWAY_AGENTS__DEFAULTS__STEPTIMEOUTSECONDS", "120")
	t.Setenv("GATEWAY_SERVER__TOKEN", "x-client-token-0123")
	t.Setenv("GATEWAY_LOG_FORMAT", "json") // read by main, not config
	t.Setenv("GATEWAY_LOG_LEVEL", "debug")
	c, err := Load("testdata/precedence.yaml")
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "stepTimeoutSeconds", *c.Agents.Defaults.StepTimeoutSeconds, 120.0)
	eq(t, "server.token", c.Server.Token, "x-client-token-0123")
	eq(t, "server.operatorToken defaults to server.token", c.Server.OperatorToken, "x-client-token-0123")
	eq(t, "step timeout of a ws turn", c.TurnSettings("ws", 0).StepTimeout, 120*time.Second)

	t.Setenv("GATEWAY_SERVER__TOKN", "x")
	err = Check("testdata/precedence.yaml")
	if err == nil || !strings.Contains(err.Error(), "GATEWAY_SERVER__TOKN") {
		t.Errorf("Check with a misspelt variable = %v, want an error naming it", err)
	}
}

func TestEnvironment(t *testing.T) {
	tests := []struct {
		name  string
		env   []string
		check func(t *testing.T, c *Config)
	}{
		{"nesting with __, case-insensitive", []string{"GATEWAY_AGENTS__DEFAULTS__STEPTIMEOUTSECONDS=120"}, func(t *testing.T, c *Config) {
			eq(t, "stepTimeoutSeconds", *c.Agents.Defaults.StepTimeoutSeconds, 120.0)
		}},
		{"single underscores inside a key are ignored", []string{"GATEWAY_agents__defaults__step_timeout_seconds=0.5"}, func(t *testing.T, c *Config) {
			eq(t, "stepTimeoutSeconds", *c.Agents.Defaults.StepTimeoutSeconds, 0.5)
		}},
		{"secret", []string{"GATEWAY_SERVER__TOKEN=x-client-token-0123", "GATEWAY_SERVER__OPERATORTOKEN=y-operator-token-456"}, func(t *testing.T, c *Config) {
			eq(t, "server.token", c.Server.Token, "x-client-token-0123")
			eq(t, "server.operatorToken", c.Server.OperatorToken, "y-operator-token-456")
		}},
		{"channel timeouts", []string{"GATEWAY_CHANNELS__TELEGRAM__TIMEOUTS__LIVENESSRESETON=activity",
			"GATEWAY_CHANNELS__WS__TIMEOUTS__MAXTURNTIMESECONDS=0"}, func(t *testing.T, c *Config) {
			eq(t, "telegram liveness", c.Channels.Telegram.Timeouts.LivenessResetOn, timeout.LivenessActivity)
			eq(t, "ws ceiling", *c.Channels.WS.Timeouts.MaxTurnTimeSeconds, 0.0)
		}},
		{"lists are comma separated", []string{
			"GATEWAY_CHANNELS__TELEGRAM__ALLOWEDCHATIDS=1, -1001234567890 ,3",
			"GATEWAY_AGENTS__OPENAI__TOOLS__HTTPGET__ALLOW=https://a.example/,https://b.example/x",
			"GATEWAY_AGENTS__EXEC__ARGS=",
		}, func(t *testing.T, c *Config) {
			eq(t, "allowedChatIDs", c.Channels.Telegram.AllowedChatIDs, []int64{1, -1001234567890, 3})
			eq(t, "allow", c.Agents.OpenAI.Tools.HTTPGet.Allow, []string{"https://a.example/", "https://b.example/x"})
			eq(t, "args", c.Agents.Exec.Args, []string{})
		}},
		{"bool, duration, float", []string{"GATEWAY_WATCHDOG__AUTOABORT=false", "GATEWAY_ALERTS__WINDOW=90s",
			"GATEWAY_SERVER__REQUESTSPERSECOND=2.5"}, func(t *testing.T, c *Config) {
			eq(t, "autoAbort", c.Watchdog.AutoAbort, false)
			eq(t, "window", c.Alerts.Window, 90*time.Second)
			eq(t, "requestsPerSecond", c.Server.RequestsPerSecond, 2.5)
		}},
		{"message templates by name", []string{"GATEWAY_MESSAGES__STEPTIMEOUT=stuck for {{.StepTimeout}}"}, func(t *testing.T, c *Config) {
			eq(t, "messages", c.Messages, map[string]string{"stepTimeout": "stuck for {{.StepTimeout}}"})
			eq(t, "rendered", c.MessageSet().Render(messages.StepTimeout, messages.Fields{StepTimeout: messages.Duration(time.Minute)}), "stuck for 1 min")
		}},
		{"exec env entries keep their case", []string{"GATEWAY_AGENTS__EXEC__ENV__Api_Key=s"}, func(t *testing.T, c *Config) {
			eq(t, "env", c.Agents.Exec.Env, map[string]string{"Api_Key": "s"})
		}},
		{"reserved variables are ignored", []string{"GATEWAY_LOG_FORMAT=json", "GATEWAY_LOG_LEVEL=debug", "OTHER_VAR=1"}, func(t *testing.T, c *Config) {
			eq(t, "listen", c.Server.Listen, "127.0.0.1:18789")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.check(t, mustLoad(t, "", tt.env...))
		})
	}
}

func TestEnvironmentErrors(t *testing.T) {
	tests := []struct {
		env  []string
		want string
	}{
		{[]string{"GATEWAY_SERVER__TOKN=x"}, `environment variable GATEWAY_SERVER__TOKN: "TOKN" is not a key of server`},
		{[]string{"GATEWAY_LOGFORMAT=json"}, `environment variable GATEWAY_LOGFORMAT: "LOGFORMAT" is not a key of the top level`},
		{[]string{"GATEWAY_=x"}, `environment variable GATEWAY_: "" is not a key of the top level`},
		{[]string{"GATEWAY_SERVER=x"}, "environment variable GATEWAY_SERVER: server is a section"},
		{[]string{"GATEWAY_SERVER__TOKEN__X=a"}, "environment variable GATEWAY_SERVER__TOKEN__X: server.token is a value and has no sub-keys"},
		{[]string{"GATEWAY_AGENTS__EXEC__ENV=a"}, "agents.exec.env is a map; set one entry with GATEWAY_AGENTS__EXEC__ENV__NAME"},
		{[]string{"GATEWAY_AGENTS__EXEC__ENV__A__B=a"}, "agents.exec.env entries have no sub-keys"},
		{[]string{"GATEWAY_AGENTS__OPENAI__TOOLS__COMMANDS=x"}, "agents.openai.tools.commands cannot be set from the environment"},
		{[]string{"GATEWAY_MESSAGES__HELLO=x"}, `environment variable GATEWAY_MESSAGES__HELLO: "HELLO" is not a message name`},
		{[]string{"GATEWAY_SERVER__MAXCONNSPERIP=supersecret"}, "environment variable GATEWAY_SERVER__MAXCONNSPERIP: server.maxConnsPerIP must be a whole number"},
		{[]string{"GATEWAY_SERVER__REQUESTSPERSECOND=fast"}, "server.requestsPerSecond must be a number"},
		{[]string{"GATEWAY_WATCHDOG__ENABLED=nope"}, "watchdog.enabled must be true or false"},
		{[]string{"GATEWAY_ALERTS__WINDOW=600"}, "alerts.window must be a duration such as 90s or 10m"},
		{[]string{"GATEWAY_CHANNELS__TELEGRAM__ALLOWEDCHATIDS=1,x"}, "channels.telegram.allowedChatIDs item 2 must be a whole number"},
		{[]string{"GATEWAY_SERVER__TOKEN=a", "GATEWAY_server__token=b"}, "environment variables GATEWAY_SERVER__TOKEN and GATEWAY_server__token both set server.token"},
		// Values set from the environment are validated like the file's.
		{[]string{"GATEWAY_AGENTS__DEFAULTS__STEPTIMEOUTSECONDS=-3"}, "agents.defaults.stepTimeoutSeconds: must be a number from 0 (disabled) to 86400 (24h), got -3"},
		{[]string{"GATEWAY_SERVER__LISTEN=0.0.0.0:1"}, "server.token is required when server.listen (0.0.0.0:1) is not a loopback address"},
		{[]string{"GATEWAY_SERVER__REQUESTSPERSECOND=NaN"}, "server.requestsPerSecond: must be a number > 0 and at most 10000, got NaN"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			_, err := loadFile(t, "", tt.env...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v\nwant it to contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "supersecret") {
				t.Errorf("the error echoes the value: %v", err)
			}
			var ce *Error
			if !errors.As(err, &ce) || len(ce.Problems) == 0 || ce.Problems[0].Key == "" {
				t.Errorf("err = %#v, want a *Error with keyed problems", err)
			}
		})
	}
}

// TestInvalid loads every testdata/invalid file; each names the error
// substrings it must produce in "# want:" lines.
func TestInvalid(t *testing.T) {
	files, _ := filepath.Glob("testdata/invalid/*.yaml")
	if len(files) < 40 {
		t.Fatalf("only %d invalid fixtures found", len(files))
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var wants []string
			for _, line := range strings.Split(string(data), "\n") {
				if w, ok := strings.CutPrefix(line, "# want: "); ok {
					wants = append(wants, w)
				}
			}
			if len(wants) == 0 {
				t.Fatal("fixture has no # want: line")
			}
			_, err = loadFile(t, path)
			if err == nil {
				t.Fatal("loaded without error")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "config "+path+": ") {
				t.Errorf("error does not start with the file: %q", msg)
			}
			for _, w := range wants {
				if !strings.Contains(msg, w) {
					t.Errorf("error\n  %s\ndoes not contain\n  %s", msg, w)
				}
			}
			if strings.Contains(msg, "zzsecret") {
				t.Errorf("error echoes a secret value: %s", msg)
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("error spans lines (bad in logs): %q", msg)
			}
		})
	}
}

func TestValid(t *testing.T) {
	tests := map[string]func(t *testing.T, c *Config){
		"empty.yaml": func(t *testing.T, c *Config) {
			d := Default()
			d.msgs, c.msgs = nil, nil
			c.src = sources{} // the file is named as a source
			if !reflect.DeepEqual(c, d) {
				t.Errorf("a comments-only file differs from the defaults:\n%s", c)
			}
		},
		"empty_sections.yaml": func(t *testing.T, c *Config) {
			eq(t, "server.listen", c.Server.Listen, "127.0.0.1:18789")
			eq(t, "server.historyLimit", c.Server.HistoryLimit, 200)
			eq(t, "runner", c.Agents.Defaults.Runner, "demo")
		},
		"fractions.yaml": func(t *testing.T, c *Config) {
			s := c.TurnSettings("ws", 0)
			eq(t, "timeout", s.Timeout, 90500*time.Millisecond)
			eq(t, "stepTimeout", s.StepTimeout, 500*time.Millisecond)
			eq(t, "progressNotifyAfter", s.ProgressNotifyAfter, 250*time.Millisecond)
			eq(t, "abortGrace", s.AbortGrace, 1500*time.Millisecond)
			eq(t, "requestsPerSecond", c.Server.RequestsPerSecond, 0.5)
			eq(t, "idempotencyTTLSeconds", c.Server.IdempotencyTTLSeconds, 2.5)
		},
		"disabled_tiers.yaml": func(t *testing.T, c *Config) {
			s := c.TurnSettings("telegram", 0)
			eq(t, "stepTimeout", s.StepTimeout, time.Duration(0))
			eq(t, "maxTurnTime", s.MaxTurnTime, time.Duration(0))
			eq(t, "progressNotifyAfter", s.ProgressNotifyAfter, time.Duration(0))
			eq(t, "timeout stays on", s.Timeout, timeout.DefaultTimeoutSeconds*time.Second)
			eq(t, "watchdog.enabled", c.Watchdog.Enabled, false)
			eq(t, "watchdog.autoAbort", c.Watchdog.AutoAbort, true)
		},
		"clamped.yaml": func(t *testing.T, c *Config) {
			s := c.TurnSettings("ws", 0)
			eq(t, "timeout clamped to the ceiling", s.Timeout, time.Duration(timeout.DefaultMaxTurnTimeSeconds)*time.Second)
			eq(t, "stepTimeout raised to the minimum", s.StepTimeout, timeout.Min)
			eq(t, "abortGrace at its bound", s.AbortGrace, timeout.MaxAbortGrace)
		},
		"offloopback_token.yaml": func(t *testing.T, c *Config) {
			eq(t, "listen", c.Server.Listen, "[::]:8080")
		},
		"loopback_names.yaml": func(t *testing.T, c *Config) {
			eq(t, "listen", c.Server.Listen, "localhost:0")
		},
		"exec_runner.yaml": func(t *testing.T, c *Config) {
			eq(t, "telegram runner", c.RunnerFor("telegram"), "exec")
			eq(t, "ws runner", c.RunnerFor("ws"), "demo")
			eq(t, "format", c.Agents.Exec.Format, "claude-stream-json")
		},
		"telegram_polling.yaml": func(t *testing.T, c *Config) {
			eq(t, "chat ids", c.Channels.Telegram.AllowedChatIDs, []int64{-1001234567890})
			eq(t, "telegram step", c.TurnSettings("telegram", 0).StepTimeout, 120*time.Second)
			eq(t, "ws step unaffected", c.TurnSettings("ws", 0).StepTimeout, timeout.DefaultStepTimeoutSeconds*time.Second)
		},
		"messages_all.yaml": func(t *testing.T, c *Config) {
			f := messages.Fields{Elapsed: messages.Duration(90 * time.Second), Limit: messages.Duration(time.Minute),
				StepTimeout: messages.Duration(5 * time.Minute), LastStep: "web_search", CurrentStep: "shell", Error: "boom"}
			set := c.MessageSet()
			for name, want := range map[messages.Name]string{
				messages.Timeout:     "Time limit 1 min reached after 1 min 30 s.",
				messages.StepTimeout: "Stuck for 5 min (last: web_search, running: shell).",
				messages.MaxTurnTime: "Ceiling 1 min reached.",
				messages.Progress:    "Still working on shell (1 min 30 s).",
				messages.Interrupted: "Restarted; last action web_search.",
				messages.Shutdown:    "Shutting down after 1 min 30 s.",
				messages.User:        "Stopped after 1 min 30 s.",
				messages.Error:       "Failed: boom",
			} {
				eq(t, string(name), set.Render(name, f), want)
			}
		},
		"full.yaml": func(t *testing.T, c *Config) {
			checkFull(t, c)
		},
	}
	files, _ := filepath.Glob("testdata/valid/*.yaml")
	for _, path := range files {
		name := filepath.Base(path)
		t.Run(name, func(t *testing.T) {
			check, ok := tests[name]
			if !ok {
				t.Fatalf("no check for fixture %s", name)
			}
			c := mustLoad(t, path)
			if err := c.Validate(); err != nil {
				t.Errorf("a loaded config does not validate: %v", err)
			}
			check(t, c)
		})
	}
	if len(files) != len(tests) {
		t.Errorf("%d fixtures, %d checks", len(files), len(tests))
	}
}

// checkFull asserts the example of docs/configuration.md loads as written.
func checkFull(t *testing.T, c *Config) {
	t.Helper()
	eq(t, "listen", c.Server.Listen, "0.0.0.0:18789")
	eq(t, "operatorToken", c.Server.OperatorToken, "example-operator-token")
	eq(t, "default runner", c.RunnerFor("ws"), "openai")
	eq(t, "telegram runner", c.RunnerFor("telegram"), "demo")
	eq(t, "ws settings", c.TurnSettings("ws", 0), timeout.Settings{
		Timeout: 1800 * time.Second, StepTimeout: 600 * time.Second, MaxTurnTime: time.Hour,
		ProgressNotifyAfter: 30 * time.Second, ProgressRepeat: time.Minute, AbortGrace: 10 * time.Second, ApprovalTimeout: 5 * time.Minute,
		LivenessResetOn: timeout.LivenessStep, BudgetWarningRatio: timeout.DefaultBudgetWarningRatio,
	})
	eq(t, "telegram settings", c.TurnSettings("telegram", 0), timeout.Settings{
		Timeout: 600 * time.Second, StepTimeout: 300 * time.Second, MaxTurnTime: time.Hour,
		ProgressNotifyAfter: 20 * time.Second, ProgressRepeat: time.Minute, AbortGrace: 10 * time.Second, ApprovalTimeout: 5 * time.Minute,
		LivenessResetOn: timeout.LivenessActivity, BudgetWarningRatio: timeout.DefaultBudgetWarningRatio,
	})
	cmds := c.Agents.OpenAI.Tools.Commands
	if len(cmds) != 1 || cmds[0].Name != "disk_usage" || !slices.Equal(cmds[0].Argv, []string{"/usr/local/bin/disk-usage"}) {
		t.Fatalf("commands = %+v", cmds)
	}
	eq(t, "parameters (free JSON schema)", cmds[0].Parameters, map[string]any{
		"type":       "object",
		"properties": map[string]any{"path": map[string]any{"type": "string", "description": "the directory"}},
		"required":   []any{"path"},
	})
	eq(t, "exec env", c.Agents.Exec.Env, map[string]string{"MY_AGENT_TOKEN": "example-exec-secret"})
	eq(t, "chat ids", c.Channels.Telegram.AllowedChatIDs, []int64{123456789, -1001234567890})
	eq(t, "alerts.window", c.Alerts.Window, 10*time.Minute)
	eq(t, "stepTimeout message", c.MessageSet().Render(messages.StepTimeout, messages.Fields{
		StepTimeout: messages.Duration(5 * time.Minute), LastStep: "web_search"}),
		"⚠️ Nothing happened for 5 min (last: web_search). Please retry.")
}

// TestUnknownKeyNamesFileAndKey is the exact message of the documentation.
func TestUnknownKeyNamesFileAndKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "turnguard.yaml")
	if err := os.WriteFile(path, []byte("agents:\n  defaults:\n    stepTimeout: 60\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := loadFile(t, path)
	want := `config ` + path + `: unknown key "agents.defaults.stepTimeout" (did you mean "agents.defaults.stepTimeoutSeconds"?)`
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v\nwant %s", err, want)
	}
	var ce *Error
	if !errors.As(err, &ce) || ce.File != path || len(ce.Problems) != 1 || ce.Problems[0].Key != "agents.defaults.stepTimeout" {
		t.Errorf("err = %#v", err)
	}
}

func TestMissingFile(t *testing.T) {
	_, err := loadFile(t, "testdata/does-not-exist.yaml")
	if err == nil || !strings.Contains(err.Error(), "config testdata/does-not-exist.yaml: ") || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want a wrapped not-exist error naming the file", err)
	}
}

func TestValidateNamesKeys(t *testing.T) {
	c := Default()
	c.Channels.Telegram.Enabled = true
	c.Channels.Telegram.Runner = "nope"
	c.Messages = map[string]string{"progress": "{{.Missing}}"}
	err := c.Validate()
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("Validate = %v, want *Error", err)
	}
	var keys []string
	for _, p := range ce.Problems {
		keys = append(keys, p.Key)
	}
	want := []string{"channels.telegram.runner", "channels.telegram.token", "messages.progress"}
	if !slices.Equal(keys, want) {
		t.Errorf("problem keys = %q, want %q (%v)", keys, want, err)
	}
	if !strings.HasPrefix(err.Error(), "config: ") {
		t.Errorf("Validate error without a file = %q", err)
	}
}

func eq[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s = %#v, want %#v", what, got, want)
	}
}

// TestTimeoutBoundsCoverEveryKey: each number key of timeout.Keys has a
// bound, so the reflective walk in timeouts checks all of them.
func TestTimeoutBoundsCoverEveryKey(t *testing.T) {
	for f := range reflect.TypeFor[timeout.Keys]().Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		if _, ok := timeoutBounds[name]; !ok && f.Type == reflect.TypeFor[*float64]() {
			t.Errorf("timeout key %s has no bound", name)
		}
	}
}

// TestEveryProblemInOneRun: problems of the environment, of decoding and of
// validation come out together (before, the first stage with a problem hid
// the others), and a value that could not be decoded is not reported again
// as out of range.
func TestEveryProblemInOneRun(t *testing.T) {
	_, err := loadFile(t, "testdata/invalid/every_stage.yaml", "GATEWAY_SERVER__TOKN=x", "GATEWAY_AGENTS__DEFAULTS__TIMEOUTSECONDS=-5")
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *Error", err)
	}
	var keys []string
	for _, p := range ce.Problems {
		keys = append(keys, p.Key)
	}
	want := []string{"GATEWAY_SERVER__TOKN", "server.lisen", "server.sendQueue", "agents.defaults.timeoutSeconds",
		"server.tickIntervalMs", "messages.hello", "messages.progress", "messages.user"}
	slices.Sort(keys)
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Errorf("problem keys = %q\nwant %q\n(%v)", keys, want, err)
	}
}

// TestEveryNumberHasABound: each number and duration key of the schema has
// a bound (a key added later without one fails here), and each bound names
// a key that exists.
func TestEveryNumberHasABound(t *testing.T) {
	keysType := reflect.TypeFor[timeout.Keys]()
	seen := map[string]bool{}
	var walk func(n *node, path string)
	walk = func(n *node, path string) {
		for _, c := range n.children {
			p := joinKey(path, c.key)
			switch {
			case c.typ == keysType:
				continue // timeoutBounds, checked by TestTimeoutBoundsCoverEveryKey
			case c.kind == kindSection:
				walk(c, p)
			case c.kind == kindList:
				walk(c, p+"[]")
			case c.kind == kindValue:
				k := c.typ.Kind()
				if k == reflect.Pointer {
					k = c.typ.Elem().Kind()
				}
				// agents.defaults squashes timeout.Keys: timeoutBounds.
				if k >= reflect.Int && k <= reflect.Float64 && path != "agents.defaults" {
					seen[p] = true
					if _, ok := bounds[p]; !ok {
						t.Errorf("number key %s has no bound in config/validate.go", p)
					}
				}
			}
		}
	}
	walk(rootSchema(), "")
	for key := range bounds {
		if !seen[key] {
			t.Errorf("bound for %s, which is not a number key", key)
		}
	}
}

// TestCheckGolden: what `gateway -check` prints for each file under
// testdata/check (issue 22): problems one a line naming the key, the
// accepted form and, where safe, the value; "did you mean" for nested keys;
// YAML errors at the right line; clamps as warnings before "config OK".
// Each FILE.yaml has its FILE.golden; regenerate with -update after
// checking the change.
func TestCheckGolden(t *testing.T) {
	files, _ := filepath.Glob("testdata/check/*.yaml")
	if len(files) < 12 {
		t.Fatalf("only %d fixtures under testdata/check", len(files))
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			report, ok := CheckReport(path)
			got := fmt.Sprintf("ok=%v\n%s", ok, report)
			matchGolden(t, strings.TrimSuffix(path, ".yaml")+".golden", got)
		})
	}
}

// matchGolden compares got with the golden file (rewriting it first with
// -update).
func matchGolden(t *testing.T, golden, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("differs from %s (run with -update if intended):\n%s\nwant:\n%s", golden, got, want)
	}
}
