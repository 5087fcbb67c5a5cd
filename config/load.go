// Package config owns turnguard's configuration: the schema (types.go), the
// built-in defaults, loading (defaults → YAML file → GATEWAY_ environment),
// validation that names the offending key, the per-turn view of a config
// (TurnSettings, RunnerFor, MessageSet), secret redaction, and hot reload
// (Source). Every key is documented in docs/configuration.md.
//
// A *Config returned by Load is valid and must not be modified: hot reload
// swaps in a new one, and turns read the one that was current when they
// started.
package config

import (
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
)

// Error is a configuration that could not be loaded because of one or more
// problems, each tied to a key or an environment variable. No problem text
// contains a configured value, so an Error is safe to log.
type Error struct {
	File     string    // the YAML file, or "" when none was given
	Problems []Problem // at least one
}

// Problem is one thing wrong with a configuration.
type Problem struct {
	// Key is the key path ("server.token",
	// "agents.openai.tools.commands[0].name") or, for an environment
	// variable that names no key, the variable.
	Key string
	// Text is the complete sentence, naming Key.
	Text string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config")
	if e.File != "" {
		b.WriteString(" " + e.File)
	}
	b.WriteString(": ")
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.Text)
	}
	return b.String()
}

// defaults are the built-in values, as flat koanf keys. Keys not listed are
// the zero value; the timeout keys are deliberately unset so that
// timeout.Resolve applies its own built-in defaults.
func defaults() map[string]any {
	return map[string]any{
		"server.listen":                "127.0.0.1:18789",
		"server.maxConnsPerIP":         64,
		"server.requestsPerSecond":     50.0,
		"server.requestBurst":          100,
		"server.tickIntervalMs":        30000,
		"server.maxPayloadBytes":       1 << 20,
		"server.maxMessageChars":       100000,
		"server.sendQueue":             256,
		"server.idempotencyTTLSeconds": 300.0,
		"server.historyLimit":          200,
		// Engine memory bounds (issue 9).
		"server.maxSessions":        10000,
		"server.sessionIdleSeconds": 3600.0,
		"server.maxStuckRuns":       16,
		"server.sendQueueBytes":     8 << 20,
		"server.sendBufferBytes":    64 << 20,
		"server.maxAnswerBytes":     1 << 20,

		"agents.defaults.runner":                     RunnerDemo,
		"agents.defaults.maxReplyChars":              100000,
		"agents.defaults.busy.overflow":              OverflowReject,
		"agents.defaults.busy.debounceMs":            0,
		"agents.defaults.busy.mode":                  BusyQueue,
		"agents.defaults.busy.maxQueued":             defaultMaxQueued,
		"agents.defaults.busy.maxQueuedBytes":        defaultMaxQueuedBytes,
		"agents.defaults.resume.maxAttempts":         3,
		"agents.defaults.resume.maxAgeSeconds":       3600.0,
		"agents.openai.maxSteps":                     8,
		"agents.openai.llmIdleTimeoutSeconds":        120.0,
		"agents.openai.tools.httpGet.maxBytes":       1 << 20,
		"agents.openai.tools.httpGet.timeoutSeconds": 20.0,
		"agents.exec.format":                         ExecFormatJSONL,
		"agents.acp.idleSeconds":                     1800.0,
		"agents.acp.startTimeoutSeconds":             60.0,

		"channels.telegram.apiURL":        "https://api.telegram.org",
		"channels.telegram.mode":          TelegramPolling,
		"channels.telegram.maxInputChars": 8000,
		"channels.telegram.streaming":     TelegramStreamDraft,

		"watchdog.enabled":   true,
		"watchdog.autoAbort": true,

		"store.driver":    StoreSQLite,
		"store.path":      "turnguard.db",
		"store.queueSize": 4096,

		"store.retention.historyDays":           90,
		"store.retention.maxMessagesPerSession": 5000,
		"store.retention.journalDays":           30,
		"store.retention.outboxDays":            7,
		"store.retention.intervalMinutes":       60,
		"store.retention.batchRows":             500,

		"cluster.enabled":                     false,
		"cluster.replicaID":                   "",
		"cluster.leaseSeconds":                3.0,
		"cluster.nats.urls":                   []string{},
		"cluster.secret":                      "",
		"cluster.secretFile":                  "",
		"cluster.nats.credsFile":              "",
		"cluster.nats.nkeySeedFile":           "",
		"cluster.nats.user":                   "",
		"cluster.nats.password":               "",
		"cluster.nats.tls.caFile":             "",
		"cluster.nats.tls.certFile":           "",
		"cluster.nats.tls.keyFile":            "",
		"cluster.nats.insecureTrustedNetwork": false,

		"alerts.stepTimeoutBurst": 5,
		"alerts.window":           10 * time.Minute,

		"telemetry.serviceName":   "turnguard",
		"telemetry.sampleRatio":   1.0,
		"telemetry.otlp.endpoint": "",
		"telemetry.otlp.protocol": OTLPGRPC,
		"telemetry.otlp.insecure": false,
	}
}

// Load reads the configuration: the built-in defaults, then the YAML file at
// path (skipped when path is ""), then GATEWAY_ environment variables, each
// layer overriding the one before. The result is validated. An error names
// the file and every offending key; a *Error when the problem is with keys
// or values, a wrapped I/O or YAML syntax error otherwise.
func Load(path string) (*Config, error) {
	var src koanf.Provider
	if path != "" {
		src = file.Provider(path)
	}
	return load(path, src, os.Environ())
}

// Check loads and validates the file at path as Load does (environment
// included) and returns its error, which names every problem found (only a
// file that cannot be read or is not YAML stops at the first); it backs
// `gateway -check`.
func Check(path string) error {
	_, err := Load(path)
	return err
}

// Default returns the built-in configuration, ignoring files and the
// environment. It is valid (a test asserts so).
func Default() *Config {
	c, err := load("", nil, nil)
	if err != nil {
		panic("config: built-in defaults are invalid: " + err.Error())
	}
	return c
}

// load is Load with the file as a provider (nil = none) and the environment
// given, so that tests and the fuzzer control both.
func load(name string, src koanf.Provider, environ []string) (*Config, error) {
	k := koanf.New(".")
	if err := k.Load(confmap.Provider(defaults(), "."), nil); err != nil {
		return nil, fmt.Errorf("config defaults: %w", err)
	}
	var fileKeys []string
	if src != nil {
		kf := koanf.New(".")
		if err := kf.Load(src, yamlParser{}); err != nil {
			return nil, fmt.Errorf("config %s: %w", name, err)
		}
		fileKeys = kf.Keys()
		if err := k.Merge(kf); err != nil {
			return nil, fmt.Errorf("config %s: %w", name, err)
		}
	}
	env := newEnvReader()
	if err := k.Load(env.provider(environ), nil); err != nil {
		return nil, fmt.Errorf("config environment: %w", err)
	}
	// Every problem is reported in one run: the environment's, decoding's
	// and validation's together (a value that could not be decoded is not
	// also reported as out of range).
	probs := env.problems
	c := new(Config)
	probs = append(probs, decode(k, c)...)
	if c.Server.OperatorToken == "" {
		c.Server.OperatorToken = c.Server.Token
	}
	set, vprobs := c.validate()
	for _, vp := range vprobs {
		if !coveredBy(vp.Key, probs) {
			probs = append(probs, vp)
		}
	}
	if len(probs) > 0 {
		return nil, &Error{File: name, Problems: probs}
	}
	c.msgs = set
	c.src = newSources(name, fileKeys, env.seen)
	return c, nil
}

// coveredBy reports whether key, or a section or list containing it,
// already has a problem in probs.
func coveredBy(key string, probs []Problem) bool {
	for _, p := range probs {
		if p.Key == "" {
			continue
		}
		if key == p.Key || strings.HasPrefix(key, p.Key+".") || strings.HasPrefix(key, p.Key+"[") {
			return true
		}
	}
	return false
}

// decode unmarshals the merged layers into c. Keys match exactly (camelCase
// as documented); unknown keys and values of the wrong type are problems
// naming the key path.
func decode(k *koanf.Koanf, c *Config) []Problem {
	err := k.UnmarshalWithConf("", c, koanf.UnmarshalConf{
		Tag: "koanf",
		DecoderConfig: &mapstructure.DecoderConfig{
			DecodeHook:  mapstructure.ComposeDecodeHookFunc(durationHook, wholeNumberHook),
			ErrorUnused: true,
			MatchName:   func(mapKey, fieldName string) bool { return mapKey == fieldName },
		},
	})
	if err == nil {
		return nil
	}
	var probs []Problem
	collectDecodeProblems(err, &probs)
	return probs
}

var (
	rootTypeName = reflect.TypeFor[Config]().String()
	// mapstructure names a map entry "messages[timeout]"; the key path is
	// "messages.timeout". List indices ("commands[0]") stay.
	mapKeyBrackets = regexp.MustCompile(`\[([^\]]*[^\]0-9][^\]]*)\]`)
)

// collectDecodeProblems turns mapstructure's error tree into problems.
func collectDecodeProblems(err error, probs *[]Problem) {
	de, isDecode := err.(*mapstructure.DecodeError)
	switch {
	case isDecode:
		name := mapKeyBrackets.ReplaceAllString(de.Name(), ".$1")
		if name == rootTypeName {
			name = ""
		}
		msg := de.Unwrap().Error()
		if keys, ok := strings.CutPrefix(msg, "has invalid keys: "); ok {
			parent := rootSchema().lookup(name)
			for _, key := range strings.Split(keys, ", ") {
				text := fmt.Sprintf("unknown key %q", joinKey(name, key))
				if parent != nil {
					if s := parent.suggest(key); s != "" {
						text += fmt.Sprintf(" (did you mean %q?)", joinKey(name, s))
					}
				}
				*probs = append(*probs, Problem{Key: joinKey(name, key), Text: text})
			}
			return
		}
		var ute *mapstructure.UnconvertibleTypeError
		switch {
		case errors.As(de.Unwrap(), &ute):
			msg = typeProblem(name, ute.Expected.Type(), ute.Value)
		case strings.HasPrefix(msg, "expected a map"):
			msg = "must be a mapping of keys to values"
		case strings.HasPrefix(msg, "source data must be an array or slice"):
			msg = "must be a list, such as [a, b]"
		}
		*probs = append(*probs, Problem{Key: name, Text: name + ": " + msg})
	case isJoin(err):
		for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			collectDecodeProblems(e, probs)
		}
	case errors.Unwrap(err) != nil: // mapstructure's "decoding failed due to…" wrapper
		collectDecodeProblems(errors.Unwrap(err), probs)
	default:
		*probs = append(*probs, Problem{Text: err.Error()})
	}
}

func isJoin(err error) bool {
	_, ok := err.(interface{ Unwrap() []error })
	return ok
}

func describeType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping"
	}
	return t.String()
}

// quotable matches a value a problem may quote: short, and a number or a
// duration as a person writes one ("10m", "1h30m", "5 s"). Anything else —
// a word, a token pasted under the wrong key — is described by its type
// only, so a problem never echoes a secret.
var quotable = regexp.MustCompile(`^[0-9][0-9.]*\s*[a-zµ]{0,3}([0-9][0-9.]*\s*[a-zµ]{0,3})*$`)

// typeProblem words a value of the wrong type for key: what the key takes,
// with an example for a number of seconds or milliseconds, and the value
// when it is quotable — with the number to write for a duration given as
// text ("stepTimeoutSeconds: 10m" → "write 600").
func typeProblem(key string, want reflect.Type, v any) string {
	what := describeType(want)
	number := want.Kind() >= reflect.Int && want.Kind() <= reflect.Float64
	switch {
	case number && strings.HasSuffix(key, "Seconds"):
		what += " of seconds, e.g. 600"
	case number && strings.HasSuffix(key, "Ms"):
		what += " of milliseconds, e.g. 30000"
	}
	got := describeValue(v)
	if str, ok := v.(string); ok && len(str) <= 20 && quotable.MatchString(strings.TrimSpace(str)) {
		got = fmt.Sprintf("the text %q", str)
		if d, err := time.ParseDuration(strings.ReplaceAll(str, " ", "")); err == nil && number && d > 0 {
			switch {
			case strings.HasSuffix(key, "Seconds"):
				got += fmt.Sprintf(" (write %s)", strconv.FormatFloat(d.Seconds(), 'f', -1, 64))
			case strings.HasSuffix(key, "Ms"):
				got += fmt.Sprintf(" (write %d)", d.Milliseconds())
			}
		}
	}
	return fmt.Sprintf("must be %s, got %s", what, got)
}

func describeValue(v any) string {
	if v == nil {
		return "nothing"
	}
	return describeType(reflect.TypeOf(v))
}

// durationHook decodes a duration key from a Go duration string ("90s",
// "10m", "1h30m"). A bare number is refused: it would be nanoseconds.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != durationType || from == durationType {
		return data, nil
	}
	if from.Kind() == reflect.String {
		d, err := time.ParseDuration(strings.TrimSpace(reflect.ValueOf(data).String()))
		if err != nil {
			return nil, errors.New("must be a duration such as 90s or 10m")
		}
		return d, nil
	}
	return nil, errors.New("must be a duration with a unit, such as 90s or 10m")
}

// wholeNumberHook refuses to truncate or wrap: a fraction or an
// out-of-range number for an integer key is an error, not a silent change.
func wholeNumberHook(from, to reflect.Type, data any) (any, error) {
	if to == durationType || to.Kind() < reflect.Int || to.Kind() > reflect.Int64 {
		return data, nil
	}
	v := reflect.ValueOf(data)
	var i int64
	switch v.Kind() {
	case reflect.Float32, reflect.Float64:
		f := v.Float()
		if f != math.Trunc(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("must be a whole number, got %v", f)
		}
		if f < math.MinInt64 || f >= math.MaxInt64 {
			return nil, errors.New("is out of range")
		}
		i = int64(f)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		u := v.Uint()
		if u > math.MaxInt64 {
			return nil, errors.New("is out of range")
		}
		i = int64(u)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		i = v.Int()
	default:
		return data, nil
	}
	if reflect.New(to).Elem().OverflowInt(i) {
		return nil, errors.New("is out of range")
	}
	return i, nil
}

// yamlParser is koanf's YAML parser with two changes: a key with no value
// ("server:" with everything below commented out) is the same as an absent
// key, so it does not wipe the defaults below it; and quoted text in YAML
// errors is elided so a mis-pasted secret is not echoed.
type yamlParser struct{}

var yamlQuoted = regexp.MustCompile("`[^`]*`")

func (yamlParser) Unmarshal(b []byte) (map[string]any, error) {
	m, err := yaml.Parser().Unmarshal(b)
	if err != nil {
		msg := yamlQuoted.ReplaceAllString(err.Error(), "`…`")
		msg = strings.ReplaceAll(strings.ReplaceAll(msg, ":\n  ", ": "), "\n  ", "; ")
		return nil, errors.New(fixYAMLLine(msg))
	}
	pruneNil(m)
	return m, nil
}

// yamlParserLine matches a YAML parser error (not a scanner error: those
// name their line right): "yaml: line 2: did not find expected key".
var yamlParserLine = regexp.MustCompile(`^yaml: line (\d+): (did not find expected (key|node content|',' or '[\]}]'|'-' indicator|<document start>))`)

// fixYAMLLine corrects the line of a YAML parser error: go.yaml.in/yaml/v3
// gives a parser error's mark counted from 0 (a scanner error's from 1), so
// "line 2" meant the file's line 3, where the mapping or list it could not
// finish starts: "yaml: did not find expected key in the mapping or list
// that starts on line 3".
func fixYAMLLine(msg string) string {
	m := yamlParserLine.FindStringSubmatchIndex(msg)
	if m == nil {
		return msg
	}
	n, err := strconv.Atoi(msg[m[2]:m[3]])
	if err != nil {
		return msg
	}
	return "yaml: " + msg[m[4]:m[5]] + " in the mapping or list that starts on line " + strconv.Itoa(n+1) + msg[m[5]:]
}

func (yamlParser) Marshal(m map[string]any) ([]byte, error) { return yaml.Parser().Marshal(m) }

// pruneNil deletes null values from nested maps. Lists are left alone (a
// JSON schema under a command's parameters may use null).
func pruneNil(m map[string]any) {
	for k, v := range m {
		switch v := v.(type) {
		case nil:
			delete(m, k)
		case map[string]any:
			pruneNil(v)
		case map[any]any:
			for k2, v2 := range v {
				if v2 == nil {
					delete(v, k2)
				} else if sub, ok := v2.(map[string]any); ok {
					pruneNil(sub)
				}
			}
		}
	}
}
