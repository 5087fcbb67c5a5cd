// Package webchat owns turnguard's built-in web chat: one static page (HTML, CSS
// and JavaScript embedded in the binary, no build step, no external assets)
// that speaks the same WebSocket protocol as the OpenClaw clients on the
// gateway's own origin. It streams the reply (Markdown built with DOM
// calls, never as HTML: a tag in a reply shows as text; links only for
// http(s), opened with rel="noopener noreferrer"), shows one line per tool
// step (a "still working" notice updates that line in place), shows a
// stopped turn's message as a warning with its stop reason in words, has a
// Stop button (chat.abort) and a session selector (sessions.list,
// chat.history). A message the gateway refuses (a busy session, an error)
// is marked "not sent" and its text goes back in the textbox; one it queues
// behind the running turn shows "Queued — next" (or "Queued (N before it)") and becomes the running
// turn when its run starts; one handed to the running turn says so. On load,
// on a session switch and after a reconnect the page re-attaches to the
// session's running turn (chat.history's turnguard.activeRun: its steps, the
// "still working" notice, a working Stop) and shows its queue. The notice of
// a turn that timed out, was interrupted, superseded or failed has a Retry
// button that sends the same text again as a new turn. The controls
// have accessible names (textbox "Message", buttons "Send" and "Stop",
// combobox "Session") and the page works at 390 px width.
//
// The page takes the gateway token from the URL fragment (#token=…, never
// sent to the server in the request line), the query (?token=…), the tab's
// session storage, or a form shown when the gateway refuses the connection.
//
// Element ids and classes are a contract with the end-to-end tests:
// #input, #send, #stop, #session, #status[data-state], .msg.user,
// .msg.user[data-status="not-sent"|"queued"|"steered"|"dropped"] with
// .msg-status (its words), .msg.assistant(.streaming),
// .step[data-status] with .step-note, .notice.warning[data-stop-reason] (the
// stop-reason code) with .stop-reason (its words) and button.retry
// ("Retry"), .notice.error; #messages[data-active-run] (the run Stop stops); and
// window.turnguard.renderMarkdown (text → DocumentFragment).
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
