package ws

import (
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
)

// Session keys. The TUI uses canonical keys agent:<agentId>:<key>; the CLI
// sends what the user typed ("main"). Both spellings are one session: a key
// without the "agent:" prefix is read as agent:main:<key>, and the engine
// session, the events and every answer use the canonical key.
const (
	defaultAgent   = "main"
	mainKey        = "main"
	mainSessionKey = "agent:main:main"
	maxKeyLen      = 256
)

// canonicalKey returns the canonical form of a session key ("" is the main
// session) or an error response for a key that cannot be one.
func canonicalKey(method, key string) (string, *rpcError) {
	key = strings.TrimSpace(key)
	if key == "" {
		return mainSessionKey, nil
	}
	if len(key) > maxKeyLen {
		return "", invalid("invalid %s params: sessionKey is longer than %d bytes", method, maxKeyLen)
	}
	if strings.IndexFunc(key, func(r rune) bool { return unicode.IsControl(r) || unicode.IsSpace(r) }) >= 0 {
		return "", invalid("invalid %s params: sessionKey must not contain spaces or control characters", method)
	}
	if i := firstInvisible(key); i >= 0 {
		r, _ := utf8.DecodeRuneInString(key[i:])
		return "", invalid("invalid %s params: sessionKey must not contain invisible or direction-changing characters "+
			"(found U+%04X at byte %d): two keys that look alike would name different sessions", method, r, i)
	}
	if rest, ok := strings.CutPrefix(key, "agent:"); ok {
		agent, sub, ok := strings.Cut(rest, ":")
		if !ok || agent == "" || sub == "" {
			return "", invalid("invalid %s params: sessionKey %q is not agent:<agentId>:<key>", method, clip(key, 80))
		}
		return key, nil
	}
	return "agent:" + defaultAgent + ":" + key, nil
}

// invisible reports whether r has no glyph of its own or changes how its
// neighbours are shown: format characters (bidi overrides and isolates,
// zero-width spaces and joiners, the BOM, soft hyphens — category Cf),
// U+FFFD (what invalid UTF-8 decodes to) and the other specials,
// variation selectors, and noncharacters. Keys are checked with
// firstInvisible, which allows the ones that are part of an emoji.
func invisible(r rune) bool {
	switch {
	case unicode.Is(unicode.Cf, r), r == utf8.RuneError, r >= 0xFFF0 && r <= 0xFFFF:
		return true
	case r >= 0xFE00 && r <= 0xFE0F, r >= 0xE0100 && r <= 0xE01EF: // variation selectors
		return true
	case r >= 0xFDD0 && r <= 0xFDEF, r&0xFFFE == 0xFFFE: // noncharacters
		return true
	}
	return false
}

// agentOf returns the agent id of a canonical key ("" for a key of another
// form, such as one a different channel made).
func agentOf(key string) string {
	rest, ok := strings.CutPrefix(key, "agent:")
	if !ok {
		return ""
	}
	agent, _, _ := strings.Cut(rest, ":")
	return agent
}

// sessionRow is a session as sessions.list / sessions.describe report it.
// verboseLevel is "on" so the TUI draws tool lines and progress notices.
// Token counts are not tracked: totalTokens is always 0.
type sessionRow struct {
	Key           string `json:"key"`
	SessionID     string `json:"sessionId"`
	UpdatedAt     int64  `json:"updatedAt"`
	Kind          string `json:"kind"`
	VerboseLevel  string `json:"verboseLevel"`
	ThinkingLevel string `json:"thinkingLevel"`
	Model         string `json:"model"`
	ModelProvider string `json:"modelProvider"`
	TotalTokens   int    `json:"totalTokens"`
	ContextTokens int    `json:"contextTokens"`
	Messages      int    `json:"messages"`
	ActiveRunID   string `json:"activeRunId,omitempty"`
}

const (
	modelProvider = "turnguard"
	contextTokens = 100000 // reported, not enforced
)

// modelName is the model the ws channel's turns run on: the OpenAI model id,
// else the runner's name (demo, exec).
func modelName(c *config.Config) string {
	r := c.RunnerFor(config.ChannelWS)
	if r == config.RunnerOpenAI && c.Agents.OpenAI.Model != "" {
		return c.Agents.OpenAI.Model
	}
	return r
}

func (s *Server) row(info gateway.SessionInfo) sessionRow {
	return sessionRow{
		Key: info.Key, SessionID: info.ID, UpdatedAt: ms(info.Updated), Kind: "direct",
		VerboseLevel: "on", ThinkingLevel: "off", Model: modelName(s.cfg.Current()), ModelProvider: modelProvider,
		ContextTokens: contextTokens, Messages: info.Messages, ActiveRunID: info.ActiveRun,
	}
}

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}
