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
package webchat

import (
	"embed"
	"net/http"

	"github.com/turnguard/turnguard/internal/staticpage"
)

//go:embed static
var files embed.FS

// Handler serves the chat page: GET / is index.html, GET /assets/NAME a file
// of the page. See staticpage.Handler.
func Handler() http.Handler { return staticpage.Handler(files, "static", "/") }
