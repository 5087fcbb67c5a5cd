package config

import (
	"errors"
	"strings"
	"testing"
)

// TestEngineMemoryBounds: the engine's memory keys (issue 9) reject zero,
// negative and too-large values with a problem naming the key.
func TestEngineMemoryBounds(t *testing.T) {
	for _, tc := range []struct {
		key    string
		set    func(*Config)
		errSub string
	}{
		{"server.maxSessions", func(c *Config) { c.Server.MaxSessions = 0 }, "from 1 to 1000000"},
		{"server.maxSessions", func(c *Config) { c.Server.MaxSessions = MaxSessionsLimit + 1 }, "from 1 to 1000000"},
		{"server.sessionIdleSeconds", func(c *Config) { c.Server.SessionIdleSeconds = -5 }, "> 0 and at most 604800"},
		{"server.sessionIdleSeconds", func(c *Config) { c.Server.SessionIdleSeconds = 0 }, "> 0 and at most 604800"},
		{"server.sessionIdleSeconds", func(c *Config) { c.Server.SessionIdleSeconds = SessionIdleSecondsLimit + 1 }, "at most 604800"},
		{"server.maxStuckRuns", func(c *Config) { c.Server.MaxStuckRuns = 0 }, "from 1 to 1000"},
		{"server.maxStuckRuns", func(c *Config) { c.Server.MaxStuckRuns = 1001 }, "from 1 to 1000"},
	} {
		c := Default()
		tc.set(c)
		var ce *Error
		if err := c.Validate(); !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Key != tc.key ||
			!strings.Contains(ce.Problems[0].Text, tc.errSub) {
			t.Errorf("%s: %v, want one problem naming it (%q)", tc.key, err, tc.errSub)
		}
	}
}
