package exec

import (
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Helpers every runner that starts an agent program shares (this one and
// runner/acp): where the program is, the environment it gets on top of the
// gateway's, and the redaction of that environment's secrets from what the
// log shows of the agent. key names the configuration section in errors
// ("agents.exec", "agents.acp").

// ResolveCommand returns the absolute path of command: looked up in PATH
// when it has no slash, else a path (relative to dir when it is not
// absolute and dir is set) to an executable file. command must not be
// empty; callers word that error themselves.
func ResolveCommand(key, command, dir string) (string, error) {
	if !strings.ContainsRune(command, os.PathSeparator) {
		p, err := osexec.LookPath(command)
		if err != nil {
			return "", fmt.Errorf("%s.command: %w", key, err)
		}
		return p, nil
	}
	p := command
	if !filepath.IsAbs(p) && dir != "" {
		p = filepath.Join(dir, p)
	}
	p, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("%s.command: %w", key, err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("%s.command: %w", key, err)
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%s.command: %q is not an executable file", key, command)
	}
	return p, nil
}

// EnvList returns env as sorted KEY=value pairs, or an error naming a
// variable that cannot be set (an empty name, "=" or NUL in it, NUL in its
// value).
func EnvList(key string, env map[string]string) ([]string, error) {
	out := make([]string, 0, len(env))
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, fmt.Errorf("%s.env: %q is not a valid environment variable", key, k)
		}
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out, nil
}

// SecretRedactor replaces env's values (the configured environment is
// secret) with "[redacted]" in text the log shows of an agent, its stderr
// lines. Values shorter than 4 bytes are left: they are not secrets worth
// hiding and would mangle every line.
func SecretRedactor(env map[string]string) *strings.Replacer {
	var pairs []string
	for _, v := range env {
		if len(v) >= 4 {
			pairs = append(pairs, v, "[redacted]")
		}
	}
	return strings.NewReplacer(pairs...)
}
