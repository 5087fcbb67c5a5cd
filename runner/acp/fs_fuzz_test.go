package acp

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzSandbox: whatever an agent sends to the client's fs methods, it never
// reads a file outside the workdir, never writes one there, and gets an
// answer or a JSON-RPC error — never a panic. The workdir holds a symbolic
// link to the secret's directory, and the secret sits next to the workdir.
//
//	go test -run '^$' -fuzz '^FuzzSandbox$' -fuzztime 30s ./runner/acp/
func FuzzSandbox(f *testing.F) {
	base := f.TempDir()
	work, outside := filepath.Join(base, "work"), filepath.Join(base, "outside")
	for _, d := range []string{work, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	const secret = "TOP-SECRET-CONTENT"
	if err := os.WriteFile(filepath.Join(outside, "secret.txt"), []byte(secret), 0o600); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(work, "link")); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "ok.txt"), []byte("line 1\nline 2\n"), 0o644); err != nil {
		f.Fatal(err)
	}
	box, err := newSandbox(work)
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []struct {
		method, params string
	}{
		{"fs/read_text_file", `{"path":"ok.txt"}`},
		{"fs/read_text_file", `{"path":"ok.txt","line":2,"limit":1}`},
		{"fs/read_text_file", `{"path":"ok.txt","line":-5,"limit":-1}`},
		{"fs/read_text_file", `{"path":"../outside/secret.txt"}`},
		{"fs/read_text_file", `{"path":"` + filepath.Join(outside, "secret.txt") + `"}`},
		{"fs/read_text_file", `{"path":"link/secret.txt"}`},
		{"fs/read_text_file", `{"path":"` + filepath.Join(work, "link", "secret.txt") + `"}`},
		{"fs/write_text_file", `{"path":"new/dir/file.txt","content":"x"}`},
		{"fs/write_text_file", `{"path":"link/evil.txt","content":"x"}`},
		{"fs/write_text_file", `{"path":"../outside/evil.txt","content":"x"}`},
		{"fs/write_text_file", `{"path":"ok.txt"}`},
		{"fs/delete", `{"path":"ok.txt"}`},
		{"fs/read_text_file", `[1,2`},
		{"fs/read_text_file", `{"path":"a\u0000b"}`},
	} {
		f.Add(seed.method, seed.params)
	}
	f.Fuzz(func(t *testing.T, method, params string) {
		res, rpcErr := box.serve(context.Background(), method, json.RawMessage(params))
		if rpcErr == nil && res != nil {
			b, _ := json.Marshal(res)
			if strings.Contains(string(b), secret) {
				t.Fatalf("%s %s read the secret outside the workdir: %s", method, params, b)
			}
		}
		entries, err := os.ReadDir(outside)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 {
			for _, e := range entries {
				if e.Name() != "secret.txt" {
					_ = os.RemoveAll(filepath.Join(outside, e.Name()))
				}
			}
			t.Fatalf("%s %s wrote outside the workdir", method, params)
		}
	})
}
