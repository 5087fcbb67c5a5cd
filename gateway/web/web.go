// Package web owns turnguard's built-in web chat: one static page (HTML, CSS
// and JavaScript embedded in the binary, no build step, no external assets)
// that speaks the same WebSocket protocol as the OpenClaw clients on the
// gateway's own origin. It streams the reply, shows one line per tool step
// (a "still working" notice updates that line in place), shows a stopped
// turn's message as a warning with its stop reason, has a Stop button
// (chat.abort) and a session selector (sessions.list, chat.history).
//
// The page takes the gateway token from the URL fragment (#token=…, never
// sent to the server in the request line), the query (?token=…), the tab's
// session storage, or a form shown when the gateway refuses the connection.
//
// Element ids and classes are a contract with the end-to-end tests:
// #input, #send, #stop, #session, #status[data-state], .msg.user,
// .msg.assistant(.streaming), .step[data-status] with .step-note,
// .notice.warning[data-stop-reason], .notice.error.
package web

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

// contentSecurityPolicy allows only the page's own files and requests
// (including WebSocket connections) to its own origin.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the chat page: GET / is index.html, GET /assets/NAME a file
// of the page. See Static.
func Handler() http.Handler { return Static(files, "static", "/") }

// Static serves an embedded single-page app whose files are under dir in
// fsys: base (e.g. "/" or "/admin") and base+"/" are index.html,
// base+"/assets/NAME" the file NAME; anything else (directories, unknown
// names) is 404. Responses carry a strict Content-Security-Policy and are
// revalidated on each load (an ETag, no-cache), so a new binary's page is
// seen at once. It panics if dir holds no index.html: the files are
// embedded, so that is a build mistake.
func Static(fsys fs.FS, dir, base string) http.Handler {
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
		panic(fmt.Sprintf("web: embedded files missing under %s: %v", dir, err))
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
