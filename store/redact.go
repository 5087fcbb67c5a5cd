package store

import (
	"errors"
	"net/url"
	"regexp"
	"strings"
	"unicode/utf8"
)

// maxErrorText bounds the error text kept in the outbox.
const maxErrorText = 512

// secretPatterns match credentials that error texts are known to carry: a
// Telegram bot token in an API URL, bearer tokens, and key=value pairs whose
// key names a secret.
var secretPatterns = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`bot[0-9]+:[A-Za-z0-9_-]+`), "bot<redacted>"},
	{regexp.MustCompile(`(?i)(bearer|basic)\s+[A-Za-z0-9._~+/=-]+`), "$1 <redacted>"},
	{regexp.MustCompile(`(?i)((?:api[_-]?key|token|secret|password|passwd|auth|signature|sig|key)["']?\s*[=:]\s*["']?)[^\s&"',;]+`), "$1<redacted>"},
}

// ErrorText is what the store keeps of err (MarkAttempt, MarkFailed): its
// message with credentials removed and at most 512 bytes. A *url.Error is
// reduced to its operation, the URL's scheme and host, and the cause, since
// HTTP client errors repeat the whole request URL (for Telegram, with the
// bot token in the path). This is a last line of defence: callers should
// not put secrets in errors in the first place. ErrorText(nil) is "".
func ErrorText(err error) string {
	if err == nil {
		return ""
	}
	var s string
	if ue, ok := errors.AsType[*url.Error](err); ok {
		s = ue.Op + " " + redactURL(ue.URL) + ": " + errorString(ue.Err)
	} else {
		s = err.Error()
	}
	return cut(RedactSecrets(s), maxErrorText)
}

// RedactSecrets is s with the credentials that ErrorText removes from
// error texts replaced: a Telegram bot token, bearer and basic
// credentials, and key=value pairs whose key names a secret. The store
// applies it to what it keeps of text that may repeat a tool's input (an
// approval's title and detail). Like ErrorText, it is a last line of
// defence.
func RedactSecrets(s string) string {
	for _, p := range secretPatterns {
		s = p.re.ReplaceAllString(s, p.repl)
	}
	return s
}

// cut is s, valid UTF-8, at most n bytes plus an ellipsis.
func cut(s string, n int) string {
	if len(s) > n {
		c := n
		for c > 0 && !utf8.RuneStart(s[c]) {
			c--
		}
		s = s[:c] + "…"
	}
	return strings.ToValidUTF8(s, "�")
}

func errorString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// redactURL keeps only the scheme and host of raw.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "<url>"
	}
	return u.Scheme + "://" + u.Host + "/…"
}
