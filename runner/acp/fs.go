package acp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// maxFile is the largest file fs/read_text_file returns (its answer is one
// line to the agent) and fs/write_text_file accepts.
const maxFile = 8 << 20

// sandbox serves the client's fs methods inside one directory (the
// workdir). Paths must be absolute (as ACP requires) or relative to the
// directory; they are resolved through os.Root, so neither ".." nor a
// symbolic link can reach outside it. Refusals are JSON-RPC errors for the
// agent.
type sandbox struct {
	dir  string // absolute, as configured
	real string // dir with its symbolic links resolved
}

func newSandbox(dir string) (*sandbox, error) {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("acp: workdir: %w", err)
	}
	return &sandbox{dir: dir, real: real}, nil
}

// rel returns path relative to the sandbox, or an error when it is outside.
func (s *sandbox) rel(path string) (string, *rpcError) {
	if path == "" || strings.ContainsRune(path, 0) {
		return "", &rpcError{Code: codeInvalidParams, Message: "invalid params: path is empty or invalid"}
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(s.dir, path)
	}
	path = filepath.Clean(path)
	for _, base := range []string{s.dir, s.real} {
		if r, err := filepath.Rel(base, path); err == nil && filepath.IsLocal(r) || r == "." {
			return r, nil
		}
	}
	return "", outside(path)
}

func outside(path string) *rpcError {
	return &rpcError{Code: codeInvalidParams, Message: fmt.Sprintf("access denied: %s is outside the workdir", path)}
}

// serve answers fs/read_text_file and fs/write_text_file.
func (s *sandbox) serve(method string, params json.RawMessage) (any, *rpcError) {
	var p struct {
		Path    string  `json:"path"`
		Content *string `json:"content"`
		Line    *int    `json:"line"`
		Limit   *int    `json:"limit"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, &rpcError{Code: codeInvalidParams, Message: "invalid params: " + err.Error()}
	}
	rel, e := s.rel(p.Path)
	if e != nil {
		return nil, e
	}
	root, err := os.OpenRoot(s.dir)
	if err != nil {
		return nil, &rpcError{Code: codeInternal, Message: "the workdir cannot be opened"}
	}
	defer root.Close()
	switch method {
	case "fs/read_text_file":
		f, err := root.Open(rel)
		if err != nil {
			return nil, fsError(p.Path, err)
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, maxFile+1))
		if err != nil {
			return nil, fsError(p.Path, err)
		}
		if len(b) > maxFile {
			return nil, &rpcError{Code: codeInvalidParams, Message: fmt.Sprintf("%s is larger than %d MB", p.Path, maxFile>>20)}
		}
		return map[string]string{"content": lines(string(b), p.Line, p.Limit)}, nil
	case "fs/write_text_file":
		if p.Content == nil {
			return nil, &rpcError{Code: codeInvalidParams, Message: "invalid params: content is required"}
		}
		if len(*p.Content) > maxFile {
			return nil, &rpcError{Code: codeInvalidParams, Message: fmt.Sprintf("content is larger than %d MB", maxFile>>20)}
		}
		if d := filepath.Dir(rel); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return nil, fsError(p.Path, err)
			}
		}
		if err := root.WriteFile(rel, []byte(*p.Content), 0o644); err != nil {
			return nil, fsError(p.Path, err)
		}
		return nil, nil
	}
	return nil, &rpcError{Code: codeMethodNotFound, Message: "method not found: " + method}
}

// fsError words an I/O error for the agent; an escape through a symbolic
// link is an access refusal.
func fsError(path string, err error) *rpcError {
	var pe *fs.PathError
	switch {
	case strings.Contains(err.Error(), "path escapes"):
		return outside(path)
	case errors.Is(err, fs.ErrNotExist):
		return &rpcError{Code: codeInvalidParams, Message: fmt.Sprintf("%s: no such file", path)}
	case errors.As(err, &pe):
		return &rpcError{Code: codeInternal, Message: fmt.Sprintf("%s: %v", path, pe.Err)}
	}
	return &rpcError{Code: codeInternal, Message: fmt.Sprintf("%s: %v", path, err)}
}

// lines returns the lines of s from line (1-based) on, at most limit of
// them; nil means from the start and no limit.
func lines(s string, line, limit *int) string {
	if line == nil && limit == nil {
		return s
	}
	parts := strings.SplitAfter(s, "\n")
	from := 0
	if line != nil && *line > 1 {
		from = min(*line-1, len(parts))
	}
	parts = parts[from:]
	if limit != nil && *limit >= 0 && *limit < len(parts) {
		parts = parts[:*limit]
	}
	return strings.Join(parts, "")
}
