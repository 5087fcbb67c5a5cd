// Package staticpage serves the gateway's embedded single-page apps (the web
// chat and the operator dashboard) with one set of rules: a strict
// Content-Security-Policy that keeps each page on its own origin, and
// revalidation on every load so a new binary's page is seen at once.
package staticpage

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

// contentSecurityPolicy allows only the page's own files and requests
// (including WebSocket connections) to its own origin.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves an embedded single-page app whose files are under dir in
// fsys: base (e.g. "/" or "/admin") and base+"/" are index.html,
// base+"/assets/NAME" the file NAME; anything else (directories, unknown
// names) is 404. Responses carry a strict Content-Security-Policy and are
// revalidated on each load (an ETag, no-cache), so a new binary's page is
// seen at once. It panics if dir holds no index.html: the files are
// embedded, so that is a build mistake.
func Handler(fsys fs.FS, dir, base string) http.Handler {
	base = strings.TrimSuffix(base, "/")
	assets := base + "/assets/"
	pages := map[string]page{}
	err := fs.WalkDir(fsys, dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		pages[strings.TrimPrefix(p, dir+"/")] = page{body: b, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil || pages["index.html"].body == nil {
		panic(fmt.Sprintf("staticpage: embedded files missing under %s: %v", dir, err))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var name string
		switch {
		case r.URL.Path == base || r.URL.Path == base+"/":
			name = "index.html"
		case strings.HasPrefix(r.URL.Path, assets):
			name = strings.TrimPrefix(r.URL.Path, assets)
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
