package config

import (
	"net/url"
	"time"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/timeout"
)

// Config is the whole configuration. Keys are camelCase in YAML; every key
// is documented in docs/configuration.md. A Config is immutable once loaded:
// hot reload swaps in a new one.
type Config struct {
	Server    Server            `koanf:"server"`
	Agents    Agents            `koanf:"agents"`
	Channels  Channels          `koanf:"channels"`
	Watchdog  Watchdog          `koanf:"watchdog"`
	Messages  map[string]string `koanf:"messages"` // template overrides, see messages
	Store     Store             `koanf:"store"`
	Cluster   Cluster           `koanf:"cluster"`
	Alerts    Alerts            `koanf:"alerts"`
	Telemetry Telemetry         `koanf:"telemetry"`

	msgs *messages.Set // Messages parsed at load; see MessageSet
	src  sources       // where each value came from; see Sources
}

// Server configures the HTTP/WebSocket listener.
type Server struct {
	Listen                string  `koanf:"listen"`                // host:port; default 127.0.0.1:18789
	Token                 string  `koanf:"token"`                 // secret; required off loopback
	OperatorToken         string  `koanf:"operatorToken"`         // secret for /api and /admin; default: Token
	MaxConnsPerIP         int     `koanf:"maxConnsPerIP"`         // default 64
	RequestsPerSecond     float64 `koanf:"requestsPerSecond"`     // per connection; default 50
	RequestBurst          int     `koanf:"requestBurst"`          // default 100
	TickIntervalMs        int     `koanf:"tickIntervalMs"`        // default 30000
	MaxPayloadBytes       int     `koanf:"maxPayloadBytes"`       // WebSocket read limit; default 1 MiB
	MaxMessageChars       int     `koanf:"maxMessageChars"`       // longest user message accepted; default 100000
	SendQueue             int     `koanf:"sendQueue"`             // frames buffered per client; default 256
	IdempotencyTTLSeconds float64 `koanf:"idempotencyTTLSeconds"` // how long finished results answer a repeated key; default 300
	HistoryLimit          int     `koanf:"historyLimit"`          // messages kept per session in memory; default 200

	// Engine memory bounds (issue 9): idle sessions are evicted (their
	// history reloads from the store on next use); runs that ignore
	// cancellation are capped per runner.
	MaxSessions        int     `koanf:"maxSessions"`        // sessions kept in memory; default 10000, at most 1000000
	SessionIdleSeconds float64 `koanf:"sessionIdleSeconds"` // an unused session is evicted after this; default 3600, at most 604800
	MaxStuckRuns       int     `koanf:"maxStuckRuns"`       // per runner: force-finalized runs whose runner still runs; default 16, at most 1000

	// Bounds against hostile clients (docs/security.md).
	AllowedHosts    []string `koanf:"allowedHosts"`    // Host names served without a token besides localhost, 127.0.0.0/8, [::1]; default none
	SendQueueBytes  int      `koanf:"sendQueueBytes"`  // bytes buffered for one WebSocket client; default 8 MiB
	SendBufferBytes int      `koanf:"sendBufferBytes"` // bytes buffered for all WebSocket clients together; default 64 MiB
	MaxAnswerBytes  int      `koanf:"maxAnswerBytes"`  // largest chat.history / sessions.list answer; default 1 MiB
}

// Agents configures the runners and the default turn limits.
type Agents struct {
	Defaults AgentDefaults `koanf:"defaults"`
	OpenAI   OpenAI        `koanf:"openai"`
	Exec     Exec          `koanf:"exec"`
	ACP      ACP           `koanf:"acp"`
}

// AgentDefaults are the timeout keys shared by all channels, the runner and
// the reply cap.
type AgentDefaults struct {
	timeout.Keys  `koanf:",squash"`
	Runner        string `koanf:"runner"`        // demo | openai | exec | acp; default demo
	MaxReplyChars int    `koanf:"maxReplyChars"` // longest reply kept, in characters; default 100000, at most MaxReplyCharsLimit
	Busy          Busy   `koanf:"busy"`          // what a message sent while its session is busy does
	Resume        Resume `koanf:"resume"`        // turns cut off by a restart or a takeover dispatched again (opt-in)
}

// Resume says whether a turn cut off by a restart, a SIGKILL or a cluster
// takeover is dispatched again at recovery (agents.defaults.resume): a
// replay-safe one at once, one cut off in a tool call after the person
// says Resume. MaxAttempts counts every attempt, the first included; a
// turn whose first attempt started more than MaxAgeSeconds ago, or that
// used its attempts, is ended for good as interrupted.
type Resume struct {
	Enabled       bool    `koanf:"enabled"`       // default false: an interrupted turn ends with a Retry
	MaxAttempts   int     `koanf:"maxAttempts"`   // attempts of one turn, the first included; default 3, 2–MaxResumeAttemptsLimit
	MaxAgeSeconds float64 `koanf:"maxAgeSeconds"` // no resume once the first attempt is older; default 3600, at most 7 days
}

// MaxResumeAttemptsLimit is the upper bound of agents.defaults.resume.maxAttempts.
const MaxResumeAttemptsLimit = 10

// Busy says what happens to a message that arrives while its session has a
// running turn (agents.defaults.busy; channels.<name>.busy overrides it key
// by key). See BusyFor.
type Busy struct {
	Mode      string `koanf:"mode"`      // queue | collect | steer | interrupt | reject; default queue ("" in a channel: inherit)
	MaxQueued *int   `koanf:"maxQueued"` // messages waiting per session; default 5, 0–MaxQueuedLimit (unset in a channel: inherit)
	// MaxQueuedBytes bounds the bytes of text waiting per session: queued
	// messages and messages steered into the running turn that its runner
	// has not taken yet. Default 1 MiB, 1–MaxQueuedBytesLimit (unset in a
	// channel: inherit).
	MaxQueuedBytes *int `koanf:"maxQueuedBytes"`
	// Overflow is what a message does when busy.maxQueued messages already
	// wait: reject (refused, the default), drop-old (the oldest waiting
	// message is dropped to make room) or drop-new (this message is
	// dropped); the sender is told in words. "" in a channel: inherit.
	Overflow string `koanf:"overflow"`
	// DebounceMs merges a burst: a message that would start a turn waits
	// this long for more, each joining it, and the window starts again
	// with each. Default 0 (off), 0–MaxDebounceMsLimit (unset in a
	// channel: inherit).
	DebounceMs *int `koanf:"debounceMs"`
}

// Overflow policies (agents.defaults.busy.overflow, channels.*.busy.overflow).
const (
	OverflowReject  = "reject"
	OverflowDropOld = "drop-old"
	OverflowDropNew = "drop-new"
)

// MaxDebounceMsLimit is the upper bound of busy.debounceMs (10 s).
const MaxDebounceMsLimit = 10000

// Busy modes (agents.defaults.busy.mode, channels.*.busy.mode).
const (
	BusyQueue     = "queue"
	BusyCollect   = "collect"
	BusySteer     = "steer"
	BusyInterrupt = "interrupt"
	BusyReject    = "reject"
)

// MaxQueuedLimit is the upper bound of busy.maxQueued.
const MaxQueuedLimit = 100

// MaxQueuedBytesLimit is the upper bound of busy.maxQueuedBytes (64 MiB).
const MaxQueuedBytesLimit = 64 << 20

// MaxReplyCharsLimit is the upper bound of agents.defaults.maxReplyChars.
const MaxReplyCharsLimit = 10_000_000

// OpenAI configures the OpenAI-compatible Chat Completions runner.
type OpenAI struct {
	BaseURL               string      `koanf:"baseURL"`
	APIKey                string      `koanf:"apiKey"` // secret
	Model                 string      `koanf:"model"`
	SystemPrompt          string      `koanf:"systemPrompt"`
	MaxSteps              int         `koanf:"maxSteps"`              // default 8
	LLMIdleTimeoutSeconds float64     `koanf:"llmIdleTimeoutSeconds"` // default 120
	Tools                 OpenAITools `koanf:"tools"`
	// Fallbacks are the providers tried, in order, when a turn's model
	// call fails or times out before the turn streamed any text or ran any
	// tool (at most MaxOpenAIFallbacks). Set in the file only.
	Fallbacks []OpenAIFallback `koanf:"fallbacks"`
}

// MaxOpenAIFallbacks bounds agents.openai.fallbacks.
const MaxOpenAIFallbacks = 8

// OpenAIFallback is one provider of agents.openai.fallbacks: the same
// tools, system prompt and timeouts as the main one, another endpoint.
type OpenAIFallback struct {
	BaseURL string `koanf:"baseURL"` // required
	APIKey  string `koanf:"apiKey"`  // secret; optional (local servers need none)
	Model   string `koanf:"model"`   // required
}

// OpenAITools enables the built-in tools; each is off unless enabled.
type OpenAITools struct {
	CurrentTime bool          `koanf:"currentTime"`
	HTTPGet     HTTPGetTool   `koanf:"httpGet"`
	Commands    []CommandTool `koanf:"commands"`
}

// HTTPGetTool is the http_get tool.
type HTTPGetTool struct {
	Enabled        bool     `koanf:"enabled"`
	Allow          []string `koanf:"allow"`          // URL prefixes the model may fetch
	MaxBytes       int      `koanf:"maxBytes"`       // default 1 MiB
	TimeoutSeconds float64  `koanf:"timeoutSeconds"` // default 20
	// RequireApproval: each fetch is asked of the person first (a denied
	// one gives the model a denial as the tool's result).
	RequireApproval bool `koanf:"requireApproval"`
}

// CommandTool is a command declared in YAML. The model's arguments reach it
// as JSON on stdin; argv is fixed.
type CommandTool struct {
	Name           string         `koanf:"name"`
	Description    string         `koanf:"description"`
	Argv           []string       `koanf:"argv"`
	Parameters     map[string]any `koanf:"parameters"` // JSON schema of the arguments
	TimeoutSeconds float64        `koanf:"timeoutSeconds"`
	MaxOutputBytes int            `koanf:"maxOutputBytes"`
	// RequireApproval: each call is asked of the person first (a denied
	// one gives the model a denial as the tool's result).
	RequireApproval bool `koanf:"requireApproval"`
}

// Exec configures the command-line agent runner.
type Exec struct {
	Command string            `koanf:"command"`
	Args    []string          `koanf:"args"`
	Env     map[string]string `koanf:"env"`
	Workdir string            `koanf:"workdir"`
	Format  string            `koanf:"format"` // jsonl | claude-stream-json; default jsonl
	// Permissions lets a jsonl agent ask the person (permission events):
	// its stdin then starts with the message as one JSON line and stays
	// open for the answers. Not with claude-stream-json.
	Permissions bool `koanf:"permissions"`
}

// ACP configures the Agent Client Protocol runner (runner/acp): one agent
// process speaking ACP on its stdio, serving every conversation.
type ACP struct {
	Command             string            `koanf:"command"`
	Args                []string          `koanf:"args"`
	Env                 map[string]string `koanf:"env"`
	Workdir             string            `koanf:"workdir"`             // the sessions' cwd and the fs sandbox; default the gateway's working directory
	IdleSeconds         float64           `koanf:"idleSeconds"`         // an ACP session unused this long is forgotten; default 1800
	StartTimeoutSeconds float64           `koanf:"startTimeoutSeconds"` // bound on starting the agent, initialize and session/new; default 60
	AuthMethod          string            `koanf:"authMethod"`          // the authMethods id passed to authenticate when the agent needs sign-in; "" = never authenticate
}

// Channels configures each channel.
type Channels struct {
	WS       Channel  `koanf:"ws"` // WebSocket clients: OpenClaw CLI/TUI and the web chat
	Telegram Telegram `koanf:"telegram"`
}

// Channel holds what every channel may override.
type Channel struct {
	Timeouts timeout.Keys `koanf:"timeouts"`
	Runner   string       `koanf:"runner"` // overrides agents.defaults.runner
	Busy     Busy         `koanf:"busy"`   // overrides agents.defaults.busy, key by key
}

// Telegram configures the Telegram bot channel.
type Telegram struct {
	Channel        `koanf:",squash"`
	Enabled        bool    `koanf:"enabled"`
	Token          string  `koanf:"token"`         // secret
	APIURL         string  `koanf:"apiURL"`        // default https://api.telegram.org
	Mode           string  `koanf:"mode"`          // polling | webhook; default polling
	WebhookSecret  string  `koanf:"webhookSecret"` // secret; the secret_token Telegram echoes
	WebhookURL     string  `koanf:"webhookURL"`    // public URL registered with setWebhook
	AllowedChatIDs []int64 `koanf:"allowedChatIDs"`
	ShowSteps      bool    `koanf:"showSteps"`
	Streaming      string  `koanf:"streaming"`     // draft | edit | off; default draft (TelegramStreaming*)
	MaxInputChars  int     `koanf:"maxInputChars"` // longer messages are refused; default 8000
}

// Watchdog holds the killswitches. Enabled false wins over AutoAbort.
type Watchdog struct {
	Enabled   bool `koanf:"enabled"`   // default true; false: no tier fires
	AutoAbort bool `koanf:"autoAbort"` // default true; false: notices only, no aborts
}

// Store configures persistence.
type Store struct {
	Driver    string         `koanf:"driver"`    // StoreSQLite (default) or StorePostgres; read at start-up
	Path      string         `koanf:"path"`      // SQLite file; default turnguard.db; ":memory:" for none
	URL       string         `koanf:"url"`       // PostgreSQL connection URL (driver postgres); a secret
	QueueSize int            `koanf:"queueSize"` // asynchronous write queue; default 4096
	Retention StoreRetention `koanf:"retention"`
}

// The store drivers (store.driver).
const (
	StoreSQLite   = "sqlite"
	StorePostgres = "postgres"
)

// Cluster configures scale-out: several gateway replicas sharing one
// PostgreSQL database (store.driver postgres) and a NATS JetStream cluster
// (docs/scaling.md). Off by default: one process, nothing else to run. Read
// at start-up.
type Cluster struct {
	Enabled      bool    `koanf:"enabled"`      // default false; true requires store.driver postgres and nats.urls
	ReplicaID    string  `koanf:"replicaID"`    // this replica's name; default hostname-pid
	LeaseSeconds float64 `koanf:"leaseSeconds"` // how long a silent replica keeps its turns; default 3, 1–60
	// Secret is shared by every replica: the requests one replica forwards
	// to another and the Telegram updates it stores are signed with it
	// (HMAC-SHA256), and a replica believes none without a valid
	// signature. At least 32 bytes; a secret. Required with Enabled,
	// unless SecretFile is set.
	Secret string `koanf:"secret"`
	// SecretFile holds Secret instead (surrounding white space ignored);
	// read at start-up.
	SecretFile string      `koanf:"secretFile"`
	NATS       ClusterNATS `koanf:"nats"`
}

// ClusterNATS says where the NATS servers are and how this replica
// authenticates to them (cluster.nats.*). With cluster.enabled, one kind
// of credentials is required — CredsFile, NKeySeedFile, User and
// Password, or those of a URL — unless InsecureTrustedNetwork.
type ClusterNATS struct {
	URLs         []string `koanf:"urls"`         // e.g. [nats://127.0.0.1:4222]; credentials in a URL are a secret
	CredsFile    string   `koanf:"credsFile"`    // a NATS .creds file (user JWT and nkey seed)
	NKeySeedFile string   `koanf:"nkeySeedFile"` // a file holding this replica's nkey seed
	User         string   `koanf:"user"`         // with Password
	Password     string   `koanf:"password"`     // a secret
	TLS          NATSTLS  `koanf:"tls"`
	// InsecureTrustedNetwork lets a cluster run without NATS credentials:
	// every process that can reach NATS can then act as a replica (answer
	// approvals as an operator, read every chat, stop any run). Only on a
	// private network where each of them is trusted; the gateway says so
	// at start-up. Default false.
	InsecureTrustedNetwork bool `koanf:"insecureTrustedNetwork"`
}

// NATSTLS is the TLS of the connection to NATS (cluster.nats.tls.*);
// a tls:// URL or a server that requires TLS uses it.
type NATSTLS struct {
	CAFile   string `koanf:"caFile"`   // the CA that signed the servers' certificates; default the system's
	CertFile string `koanf:"certFile"` // a client certificate, with KeyFile
	KeyFile  string `koanf:"keyFile"`
}

// HasCredentials reports whether n names credentials for NATS: a creds
// file, an nkey seed file, a user, or a URL with a user or token.
func (n ClusterNATS) HasCredentials() bool {
	if n.CredsFile != "" || n.NKeySeedFile != "" || n.User != "" {
		return true
	}
	for _, raw := range n.URLs {
		if u, err := url.Parse(raw); err == nil && u.User != nil && u.User.Username() != "" {
			return true
		}
	}
	return false
}

// StoreRetention is what the store prunes, and how often (store.retention.*).
// A zero age or count keeps those rows forever. Read at start-up.
type StoreRetention struct {
	HistoryDays           int `koanf:"historyDays"`           // chat history and ended turns; default 90, 0–3650
	MaxMessagesPerSession int `koanf:"maxMessagesPerSession"` // newest kept per session; default 5000, 0–1000000
	JournalDays           int `koanf:"journalDays"`           // journal and stall history; default 30, 0–3650
	OutboxDays            int `koanf:"outboxDays"`            // delivered or given-up outbox rows; default 7, 0–3650
	IntervalMinutes       int `koanf:"intervalMinutes"`       // how often; default 60, 1–1440
	BatchRows             int `koanf:"batchRows"`             // rows per delete transaction; default 500, 1–10000
}

// Alerts configures operator alerts.
type Alerts struct {
	TelegramChatIDs  []int64       `koanf:"telegramChatIDs"`
	WebhookURL       string        `koanf:"webhookURL"`
	StepTimeoutBurst int           `koanf:"stepTimeoutBurst"` // default 5
	Window           time.Duration `koanf:"window"`           // default 10m
}

// Telemetry configures tracing (telemetry.*): every turn an OpenTelemetry
// trace, exported over OTLP when OTLP.Endpoint is set; off otherwise. Read
// at start-up.
type Telemetry struct {
	ServiceName string        `koanf:"serviceName"` // the service.name resource attribute; default turnguard
	SampleRatio float64       `koanf:"sampleRatio"` // share of turns traced, 0–1; default 1
	OTLP        TelemetryOTLP `koanf:"otlp"`
}

// TelemetryOTLP says where traces go (telemetry.otlp.*).
type TelemetryOTLP struct {
	Endpoint string            `koanf:"endpoint"` // host:port or http(s):// URL of an OTLP receiver; "" = tracing off
	Protocol string            `koanf:"protocol"` // grpc | http; default grpc
	Insecure bool              `koanf:"insecure"` // plaintext, no TLS; default false (an http:// URL is plaintext anyway)
	Headers  map[string]string `koanf:"headers"`  // sent with every export (e.g. an API key); the values are secrets
}

// The OTLP protocols (telemetry.otlp.protocol).
const (
	OTLPGRPC = "grpc"
	OTLPHTTP = "http"
)
