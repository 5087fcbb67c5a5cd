package admin

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var files embed.FS

// contentSecurityPolicy allows only the page's own files and requests to
// its own origin.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// pageHandler serves the dashboard: /admin and /admin/ are index.html,
// /admin/assets/NAME a file of the page; anything else is 404. Responses
// carry a strict Content-Security-Policy and are revalidated on each load.
func pageHandler() http.Handler {
	pages := map[string]page{}
	err := fs.WalkDir(files, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := files.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		pages[strings.TrimPrefix(p, "static/")] = page{body: b, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil || pages["index.html"].body == nil {
		panic(fmt.Sprintf("admin: embedded files missing: %v", err))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var name string
		switch {
		case r.URL.Path == "/admin" || r.URL.Path == "/admin/":
			name = "index.html"
		case strings.HasPrefix(r.URL.Path, "/admin/assets/"):
			name = strings.TrimPrefix(r.URL.Path, "/admin/assets/")
			if name == "index.html" {
				name = ""
			}
		}
		pg, ok := pages[name]
		if !ok {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", pg.etag)
		if ct := mime.TypeByExtension(path.Ext(name)); ct != "" {
			h.Set("Content-Type", ct)
		}
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(pg.body))
	})
}

type page struct {
	body []byte
	etag string
}
