package admin

import (
	"embed"
	"net/http"

	"github.com/turnguard/turnguard/internal/staticpage"
)

//go:embed static
var files embed.FS

// pageHandler serves the dashboard: /admin and /admin/ are index.html,
// /admin/assets/NAME a file of the page; anything else is 404 (see
// staticpage.Handler for the headers).
func pageHandler() http.Handler { return staticpage.Handler(files, "static", "/admin") }
