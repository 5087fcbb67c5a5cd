package acp

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestReadCostIsBounded: what one fs/read_text_file allocates, from the
// request to its reply line written to the agent, is bounded by the text
// returned, not by the file: an 8 MiB file of NUL bytes cost ~210 MB
// before (read, string copy, JSON escaping, the reply marshalled twice)
// and is now refused after its first chunk.
func TestReadCostIsBounded(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"zero.bin": strings.Repeat("\x00", 8<<20),
		"max.txt":  strings.Repeat(strings.Repeat("y", 99)+"\n", maxRead/100),
		"big.txt":  strings.Repeat(strings.Repeat("x", 99)+"\n", 8<<20/100),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	box, err := newSandbox(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	go func() { _, _ = ioDiscard(r) }()
	c := newConn(w, nil)
	defer w.Close()
	tests := []struct {
		params   string
		maxBytes uint64 // allocated at most
		err      string
	}{
		{`{"path":"zero.bin"}`, 256 << 10, "zero.bin is not a text file (it holds NUL bytes)"},
		{`{"path":"big.txt"}`, 4*maxRead + 256<<10, "big.txt: the text asked for is larger than 2 MB; read it in parts with line and limit"},
		{`{"path":"big.txt","line":50000,"limit":100}`, 256 << 10, ""},
		{`{"path":"max.txt"}`, 3 * maxRead, ""},
	}
	for _, tc := range tests {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		res, e := box.serve(context.Background(), "fs/read_text_file", json.RawMessage(tc.params))
		if err := c.reply(json.RawMessage(`1`), res, e); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		got := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s: %d KiB allocated", tc.params, got>>10)
		if got > tc.maxBytes {
			t.Errorf("%s: %d bytes allocated, want at most %d", tc.params, got, tc.maxBytes)
		}
		switch {
		case tc.err == "" && e != nil:
			t.Errorf("%s: %v", tc.params, e)
		case tc.err != "" && (e == nil || e.Message != tc.err):
			t.Errorf("%s: error %v, want %q", tc.params, e, tc.err)
		}
	}
}

// TestReadStopsWhenCancelled: a read whose turn ended (ctx done) stops
// with an error instead of reading on.
func TestReadStopsWhenCancelled(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("text"), 0o644); err != nil {
		t.Fatal(err)
	}
	box, err := newSandbox(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, m := range []string{"fs/read_text_file", "fs/write_text_file"} {
		_, e := box.serve(ctx, m, json.RawMessage(`{"path":"a.txt","content":"new"}`))
		if e == nil || e.Message != "the request was cancelled: its turn ended" {
			t.Errorf("%s: %v, want cancelled", m, e)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "a.txt")); string(b) != "text" {
		t.Errorf("a cancelled write wrote %q", b)
	}
}
