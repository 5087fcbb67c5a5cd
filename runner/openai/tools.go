package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	osexec "os/exec"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner/exec"
)

// tool is one function the model may call. run's error is shown to the
// model as the tool's result ("error: …"); it is never a turn failure.
type tool struct {
	name    string
	def     toolDef
	run     func(ctx context.Context, args json.RawMessage) (string, error)
	approve bool // requireApproval: each call is asked of the person first
}

// Built-in tool names.
const (
	ToolCurrentTime = "current_time"
	ToolHTTPGet     = "http_get"
)

var toolNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (r *Runner) buildTools(cfg config.OpenAITools) error {
	r.toolByName = map[string]tool{}
	add := func(t tool) {
		r.toolByName[t.name] = t
		r.toolDefs = append(r.toolDefs, t.def)
	}
	if cfg.CurrentTime {
		add(currentTimeTool())
	}
	if cfg.HTTPGet.Enabled {
		t, err := r.httpGetTool(cfg.HTTPGet)
		if err != nil {
			return err
		}
		add(t)
	}
	for i, c := range cfg.Commands {
		t, err := commandTool(c, fmt.Sprintf("agents.openai.tools.commands[%d]", i))
		if err != nil {
			return err
		}
		if _, dup := r.toolByName[t.name]; dup {
			return fmt.Errorf("agents.openai.tools.commands[%d].name: %q is already used by another tool", i, t.name)
		}
		add(t)
	}
	return nil
}

// current_time

func currentTimeTool() tool {
	return tool{
		name: ToolCurrentTime,
		def: toolDef{Type: "function", Function: toolDefFunc{
			Name:        ToolCurrentTime,
			Description: "Returns the current date and time (UTC, and in an optional IANA time zone).",
			Parameters: map[string]any{
				"type": "object",
				"properties": map[string]any{
					"timezone": map[string]any{"type": "string", "description": "IANA time zone, e.g. Europe/Paris (optional)"},
				},
			},
		}},
		run: func(ctx context.Context, args json.RawMessage) (string, error) {
			var a struct {
				Timezone string `json:"timezone"`
			}
			if err := json.Unmarshal(args, &a); err != nil {
				return "", fmt.Errorf("arguments: %w", err)
			}
			now := time.Now()
			out := map[string]any{"utc": now.UTC().Format(time.RFC3339), "unix": now.Unix()}
			if a.Timezone != "" {
				loc, err := time.LoadLocation(a.Timezone)
				if err != nil {
					return "", fmt.Errorf("unknown time zone %q", a.Timezone)
				}
				out["timezone"] = a.Timezone
				out["local"] = now.In(loc).Format(time.RFC3339)
			}
			b, _ := json.Marshal(out)
			return string(b), nil
		},
	}
}

// http_get

type allowRule struct {
	scheme, host, path string // path "" or ending without "/" matches at segment boundaries
}

func (a allowRule) match(u *url.URL) bool {
	if u.Scheme != a.scheme || strings.ToLower(u.Host) != a.host {
		return false
	}
	p := u.EscapedPath()
	if a.path == "" || a.path == "/" {
		return true
	}
	if !strings.HasPrefix(p, a.path) {
		return false
	}
	return len(p) == len(a.path) || strings.HasSuffix(a.path, "/") || p[len(a.path)] == '/'
}

func parseAllow(s string) (allowRule, error) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return allowRule{}, fmt.Errorf("%q is not an http(s) URL prefix like https://api.example.com/v1/", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return allowRule{}, fmt.Errorf("%q: a prefix has no query or fragment", s)
	}
	return allowRule{scheme: u.Scheme, host: strings.ToLower(u.Host), path: u.EscapedPath()}, nil
}

func (r *Runner) httpGetTool(cfg config.HTTPGetTool) (tool, error) {
	const key = "agents.openai.tools.httpGet"
	if len(cfg.Allow) == 0 {
		return tool{}, fmt.Errorf("%s.allow: list at least one URL prefix the model may fetch", key)
	}
	var rules []allowRule
	for i, s := range cfg.Allow {
		rule, err := parseAllow(s)
		if err != nil {
			return tool{}, fmt.Errorf("%s.allow[%d]: %w", key, i, err)
		}
		rules = append(rules, rule)
	}
	maxBytes := cfg.MaxBytes
	switch {
	case maxBytes == 0:
		maxBytes = DefaultHTTPGetMaxBytes
	case maxBytes < 0:
		return tool{}, fmt.Errorf("%s.maxBytes: must be ≥ 1, got %d", key, maxBytes)
	}
	timeout, err := seconds(cfg.TimeoutSeconds, DefaultHTTPGetTimeout, key+".timeoutSeconds")
	if err != nil {
		return tool{}, err
	}
	allowed := func(u *url.URL) error {
		if u.Scheme != "http" && u.Scheme != "https" {
			return fmt.Errorf("only http and https URLs can be fetched, not %q", u.Scheme)
		}
		if u.User != nil {
			return errors.New("URLs with credentials are not allowed")
		}
		for _, seg := range strings.Split(u.Path, "/") {
			if seg == "." || seg == ".." {
				return errors.New("URLs with . or .. path segments are not allowed")
			}
		}
		for _, rule := range rules {
			if rule.match(u) {
				return nil
			}
		}
		return fmt.Errorf("%s is not in the allowed URL list (agents.openai.tools.httpGet.allow)", u.Redacted())
	}
	client := &http.Client{}
	if r.toolClient != nil {
		c := *r.toolClient
		client = &c
	}
	client.Timeout = 0 // the per-call context bounds the request
	client.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= 5 {
			return errors.New("too many redirects")
		}
		if err := allowed(req.URL); err != nil {
			return fmt.Errorf("redirect refused: %w", err)
		}
		return nil
	}

	run := func(ctx context.Context, args json.RawMessage) (string, error) {
		var a struct {
			URL string `json:"url"`
		}
		if err := json.Unmarshal(args, &a); err != nil || a.URL == "" {
			return "", errors.New(`arguments: want {"url": "https://…"}`)
		}
		u, err := url.Parse(a.URL)
		if err != nil {
			return "", fmt.Errorf("bad URL: %w", err)
		}
		if err := allowed(u); err != nil {
			return "", err
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		req, err := http.NewRequestWithContext(cctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return "", fmt.Errorf("bad URL: %w", err)
		}
		resp, err := client.Do(req)
		if err != nil {
			if errors.Is(cctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
				return "", fmt.Errorf("fetching %s timed out after %s", u.Redacted(), timeout)
			}
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			return "", fmt.Errorf("fetching %s: %w", u.Redacted(), err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, int64(maxBytes)+1))
		if err != nil {
			if errors.Is(cctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
				return "", fmt.Errorf("fetching %s timed out after %s", u.Redacted(), timeout)
			}
			return "", fmt.Errorf("reading %s: %w", u.Redacted(), err)
		}
		truncated := len(body) > maxBytes
		if truncated {
			body = body[:maxBytes]
		}
		out, _ := json.Marshal(struct {
			Status      int    `json:"status"`
			ContentType string `json:"contentType,omitempty"`
			Body        string `json:"body"`
			Truncated   bool   `json:"truncated,omitempty"`
		}{resp.StatusCode, resp.Header.Get("Content-Type"), string(body), truncated})
		return string(out), nil
	}
	return tool{
		name: ToolHTTPGet,
		def: toolDef{Type: "function", Function: toolDefFunc{
			Name:        ToolHTTPGet,
			Description: "Fetches a URL with HTTP GET and returns the status, content type and body. Only URLs under these prefixes are allowed: " + strings.Join(cfg.Allow, ", "),
			Parameters: map[string]any{
				"type":       "object",
				"properties": map[string]any{"url": map[string]any{"type": "string", "description": "the http(s) URL to fetch"}},
				"required":   []string{"url"},
			},
		}},
		run:     run,
		approve: cfg.RequireApproval,
	}, nil
}

// command tools

func commandTool(c config.CommandTool, key string) (tool, error) {
	if !toolNameRE.MatchString(c.Name) {
		return tool{}, fmt.Errorf("%s.name: %q must be 1–64 letters, digits, _ or -", key, c.Name)
	}
	if c.Name == ToolCurrentTime || c.Name == ToolHTTPGet {
		return tool{}, fmt.Errorf("%s.name: %q is a built-in tool", key, c.Name)
	}
	if len(c.Argv) == 0 || c.Argv[0] == "" {
		return tool{}, fmt.Errorf("%s.argv: required: the command and its fixed arguments, e.g. [\"/usr/local/bin/lookup\", \"--json\"]", key)
	}
	path, err := osexec.LookPath(c.Argv[0])
	if err != nil {
		return tool{}, fmt.Errorf("%s.argv[0]: %q: %w", key, c.Argv[0], err)
	}
	timeout, err := seconds(c.TimeoutSeconds, DefaultCommandTimeout, key+".timeoutSeconds")
	if err != nil {
		return tool{}, err
	}
	maxOut := c.MaxOutputBytes
	switch {
	case maxOut == 0:
		maxOut = DefaultCommandOutputBytes
	case maxOut < 0:
		return tool{}, fmt.Errorf("%s.maxOutputBytes: must be ≥ 1, got %d", key, maxOut)
	}
	var params any = map[string]any{"type": "object", "properties": map[string]any{}}
	if c.Parameters != nil {
		if t, _ := c.Parameters["type"].(string); t != "object" {
			return tool{}, fmt.Errorf("%s.parameters: must be a JSON schema with type: object", key)
		}
		if _, err := json.Marshal(c.Parameters); err != nil {
			return tool{}, fmt.Errorf("%s.parameters: %w", key, err)
		}
		params = c.Parameters
	}
	argv := append([]string(nil), c.Argv...)
	name := c.Name
	run := func(ctx context.Context, args json.RawMessage) (string, error) {
		return runCommand(ctx, name, path, argv, args, timeout, maxOut)
	}
	return tool{
		name:    name,
		def:     toolDef{Type: "function", Function: toolDefFunc{Name: name, Description: c.Description, Parameters: params}},
		run:     run,
		approve: c.RequireApproval,
	}, nil
}

// runCommand runs a command tool: fixed argv, the model's arguments as JSON
// on stdin, never through a shell. The process group is killed on timeout
// or when ctx is cancelled (then ctx.Err() is returned).
func runCommand(ctx context.Context, name, path string, argv []string, args json.RawMessage, timeout time.Duration, maxOut int) (string, error) {
	cmd := osexec.Command(path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env = exec.Environ()
	cmd.Stdin = bytes.NewReader(args)
	stdout := &capped{max: maxOut}
	stderr := &capped{max: 2048}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = time.Second // an escaped process holding the pipes
	p, err := exec.Start(cmd)
	if err != nil {
		return "", fmt.Errorf("cannot start %s: %w", argv[0], err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	timedOut := false
	select {
	case <-p.Done():
	case <-ctx.Done():
		_ = p.Signal(syscall.SIGKILL)
	case <-t.C:
		timedOut = true
		_ = p.Signal(syscall.SIGKILL)
	}
	werr := p.Wait()
	switch {
	case ctx.Err() != nil:
		return "", ctx.Err()
	case timedOut:
		return "", fmt.Errorf("command %s timed out after %s", name, timeout)
	}
	out := stdout.String()
	if werr != nil {
		msg := fmt.Sprintf("command %s failed: %v", name, werr)
		if s := strings.TrimSpace(stderr.String()); s != "" {
			msg += "\nstderr: " + s
		}
		if out != "" {
			msg += "\nstdout: " + out
		}
		return "", errors.New(msg)
	}
	return out, nil
}

// capped keeps the first max bytes written and notes the rest.
type capped struct {
	max   int
	buf   bytes.Buffer
	extra int64
}

func (c *capped) Write(p []byte) (int, error) {
	room := c.max - c.buf.Len()
	if room >= len(p) {
		c.buf.Write(p)
	} else {
		c.buf.Write(p[:max(room, 0)])
		c.extra += int64(len(p) - max(room, 0))
	}
	return len(p), nil
}

func (c *capped) String() string {
	if c.extra == 0 {
		return c.buf.String()
	}
	return fmt.Sprintf("%s\n[output truncated: %d more bytes]", c.buf.String(), c.extra)
}

// seconds converts a configured number of seconds (0 = def).
func seconds(v float64, def time.Duration, key string) (time.Duration, error) {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0) || v < 0:
		return 0, fmt.Errorf("%s: must be a number ≥ 0, got %v", key, v)
	case v == 0:
		return def, nil
	}
	return max(time.Duration(v*float64(time.Second)), time.Millisecond), nil
}
