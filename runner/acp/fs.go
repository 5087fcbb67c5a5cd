package acp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/turnguard/turnguard/internal/jsonstr"
)

// Bounds of the client's fs methods.
const (
	// maxRead is the most text fs/read_text_file returns (its answer is one
	// line to the agent): a longer file is refused, and the agent is told
	// to read it in parts with line and limit.
	maxRead = 2 << 20
	// maxFile is the largest content fs/write_text_file accepts.
	maxFile = 8 << 20
	// readChunk is what one read of a file takes: a binary file is refused
	// after its first chunk that holds a NUL byte, and a cancelled request
	// stops between chunks.
	readChunk = 32 << 10
)

// sandbox serves the client's fs methods inside one directory (the
// workdir). Paths must be absolute (as ACP requires) or relative to the
// directory; they are resolved through os.Root, so neither ".." nor a
// symbolic link can reach outside it. Only regular files with one link are
// read or written: a FIFO, a device or a socket is refused without
// blocking (it is opened with O_NONBLOCK and checked with fstat), and so is
// a hard link, which may be a file outside the workdir. Refusals are
// JSON-RPC errors for the agent.
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

// fsParams are the params of the fs methods.
type fsParams struct {
	Path    string  `json:"path"`
	Content *string `json:"content"`
	Line    *int    `json:"line"`
	Limit   *int    `json:"limit"`
}

// serve answers fs/read_text_file and fs/write_text_file; it stops (with
// an error) once ctx is done.
func (s *sandbox) serve(ctx context.Context, method string, params json.RawMessage) (any, *rpcError) {
	var p fsParams
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
		f, e := open(root, rel, p.Path, os.O_RDONLY)
		if e != nil {
			return nil, e
		}
		defer f.Close()
		text, e := read(ctx, f, p)
		if e != nil {
			return nil, e
		}
		return textResult{text}, nil
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
		f, e := open(root, rel, p.Path, os.O_WRONLY|os.O_CREATE)
		if e != nil {
			return nil, e
		}
		defer f.Close()
		if err := ctx.Err(); err != nil {
			return nil, cancelled()
		}
		if err := f.Truncate(0); err != nil {
			return nil, fsError(p.Path, err)
		}
		if _, err := f.WriteString(*p.Content); err != nil {
			return nil, fsError(p.Path, err)
		}
		if err := f.Close(); err != nil {
			return nil, fsError(p.Path, err)
		}
		return nil, nil
	}
	return nil, &rpcError{Code: codeMethodNotFound, Message: "method not found: " + method}
}

// open opens rel in root without blocking (O_NONBLOCK: a FIFO without a
// peer does not wait for one) and returns it only when it is a regular
// file with a single link.
func open(root *os.Root, rel, path string, flag int) (*os.File, *rpcError) {
	f, err := root.OpenFile(rel, flag|syscall.O_NONBLOCK, 0o644)
	if err != nil {
		return nil, fsError(path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fsError(path, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, &rpcError{Code: codeInvalidParams, Message: fmt.Sprintf("%s is not a regular file", path)}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
		f.Close()
		return nil, &rpcError{Code: codeInvalidParams, Message: fmt.Sprintf("access denied: %s has other hard links", path)}
	}
	return f, nil
}

// read returns the text of f from line p.Line (1-based) on, at most p.Limit
// lines (nil: from the start, no limit). It reads f in chunks and keeps
// only the lines returned, so its cost is bounded by maxRead whatever the
// file's size; a NUL byte (a binary file) or more than maxRead bytes of
// text is an error, and so is ctx ending.
func read(ctx context.Context, f *os.File, p fsParams) (string, *rpcError) {
	from, left := 1, -1
	if p.Line != nil && *p.Line > 1 {
		from = *p.Line
	}
	if p.Limit != nil && *p.Limit >= 0 {
		left = *p.Limit
	}
	var size int64 = readChunk
	if fi, err := f.Stat(); err == nil && from == 1 {
		size = min(fi.Size(), maxRead) + 1
	}
	var out strings.Builder // its String() is the text, not a copy
	br := bufio.NewReaderSize(ctxReader{ctx, f}, readChunk)
	for n := 1; left != 0; {
		part, err := br.ReadSlice('\n')
		if bytes.IndexByte(part, 0) >= 0 {
			return "", &rpcError{Code: codeInvalidParams, Message: fmt.Sprintf("%s is not a text file (it holds NUL bytes)", p.Path)}
		}
		if n >= from {
			if out.Cap() == 0 { // sized once the first part is known to be text
				out.Grow(int(max(size, int64(len(part)))))
			}
			if out.Len()+len(part) > maxRead {
				return "", &rpcError{Code: codeInvalidParams, Message: fmt.Sprintf("%s: the text asked for is larger than %d MB; read it in parts with line and limit", p.Path, maxRead>>20)}
			}
			out.Write(part)
		}
		switch {
		case err == nil:
			if n >= from && left > 0 {
				left--
			}
			n++
		case errors.Is(err, bufio.ErrBufferFull):
		case errors.Is(err, io.EOF):
			return out.String(), nil
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			return "", cancelled()
		default:
			return "", fsError(p.Path, err)
		}
	}
	return out.String(), nil
}

// textResult is fs/read_text_file's result, {"content": text}. conn.reply
// writes it straight into the reply line (appendTo), so a file's text is
// held twice at most: as read and as sent.
type textResult struct{ content string }

// appendTo appends the result as JSON to b.
func (r textResult) appendTo(b []byte) []byte {
	b = append(b, `{"content":`...)
	return append(jsonstr.Append(b, r.content), '}')
}

func (r textResult) MarshalJSON() ([]byte, error) { return r.appendTo(nil), nil }

// ctxReader fails its reads once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}

func cancelled() *rpcError {
	return &rpcError{Code: codeInternal, Message: "the request was cancelled: its turn ended"}
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
	case errors.Is(err, syscall.ENXIO):
		return &rpcError{Code: codeInvalidParams, Message: fmt.Sprintf("%s is not a regular file", path)}
	case errors.As(err, &pe):
		return &rpcError{Code: codeInternal, Message: fmt.Sprintf("%s: %v", path, pe.Err)}
	}
	return &rpcError{Code: codeInternal, Message: fmt.Sprintf("%s: %v", path, err)}
}
