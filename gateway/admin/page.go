package admin

import (
	"embed"
	"net/http"

	"github.com/turnguard/turnguard/gateway/web"
)

//go:embed static
var files embed.FS

// pageHandler serves the dashboard: /admin and /admin/ are index.html,
// /admin/assets/NAME a file of the page; anything else is 404 (see
// web.Static for the headers).
func pageHandler() http.Handler { return web.Static(files, "static", "/admin") }
