package openai

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/turnguard/turnguard/runner"
)

// Causes of a failed turn, reachable with errors.Is.
var (
	// ErrIdleTimeout: the provider sent nothing for the idle timeout, twice.
	ErrIdleTimeout = errors.New("openai: model stream idle")
	// ErrBreakerOpen: the idle timeout fired and the circuit breaker is open,
	// so the call was not retried.
	ErrBreakerOpen = errors.New("openai: idle circuit breaker open")
	// ErrMaxSteps: the model was still calling tools after maxSteps calls.
	ErrMaxSteps = errors.New("openai: max steps reached")
)

// StatusError is an HTTP error answer of the provider. Message is the
// provider's own explanation, with the API key removed and shortened.
type StatusError struct {
	StatusCode int
	Message    string
	Attempts   int // how many requests were made
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("openai: provider answered HTTP %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// failure is an error with a message for the user and a typed cause.
// Error() is the user's message; errors.As finds the *runner.UserError and
// errors.Is/As the cause.
type failure struct {
	user  string
	cause error
}

func (f *failure) Error() string { return f.user }
func (f *failure) Unwrap() []error {
	return []error{&runner.UserError{Message: f.user}, f.cause}
}

// statusFailure builds the user's error for a provider HTTP error of the
// provider configured under key (agents.openai, agents.openai.fallbacks[i]).
func statusFailure(se *StatusError, key string) error {
	var b strings.Builder
	switch {
	case se.StatusCode == http.StatusTooManyRequests:
		fmt.Fprintf(&b, "The model provider is rate-limiting requests (HTTP 429); gave up after %d attempts.", se.Attempts)
	case se.StatusCode >= 500 || se.StatusCode == http.StatusRequestTimeout:
		fmt.Fprintf(&b, "The model provider failed (HTTP %d %s); gave up after %d attempts.", se.StatusCode, http.StatusText(se.StatusCode), se.Attempts)
	default:
		fmt.Fprintf(&b, "The model provider rejected the request (HTTP %d %s).", se.StatusCode, http.StatusText(se.StatusCode))
		switch se.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			b.WriteString(" Check " + key + ".apiKey.")
		case http.StatusNotFound:
			b.WriteString(" Check " + key + ".baseURL and " + key + ".model.")
		}
	}
	if se.Message != "" {
		fmt.Fprintf(&b, " Provider says: %s", se.Message)
	}
	return &failure{user: b.String(), cause: se}
}

const maxProviderMessage = 300

// tokenRE splits text into the words checked for key fragments.
var tokenRE = regexp.MustCompile(`[^\s"'<>,;()\[\]{}]+`)

// redact removes the API key from s: the whole key, and every word that
// contains 8 or more consecutive characters of it (providers echo keys
// partly masked, e.g. "sk-abc1****wxyz9876").
func redact(s, key string) string {
	if key == "" || s == "" {
		return s
	}
	s = strings.ReplaceAll(s, key, "[redacted]")
	const window = 8
	if len(key) < window {
		return s
	}
	frags := make(map[string]struct{}, len(key)-window+1)
	for i := 0; i+window <= len(key); i++ {
		frags[key[i:i+window]] = struct{}{}
	}
	return tokenRE.ReplaceAllStringFunc(s, func(w string) string {
		for i := 0; i+window <= len(w); i++ {
			if _, ok := frags[w[i:i+window]]; ok {
				return "[redacted]"
			}
		}
		return w
	})
}

// shorten cuts s to n bytes at a rune boundary, marking the cut.
func shorten(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	for n > 0 && !isRuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
