// Package e2e holds turnguard's end-to-end tests (build tag e2e): the built
// gateway binary driven by the real, unmodified OpenClaw CLI (`gateway call
// health`, `status`, `chat.send`, `agent --expect-final`, `openclaw agent`)
// and TUI (in tmux), and by the web chat page in headless Chromium
// (webchat.mjs, with playwright-core; webchat-busy.mjs against a gateway per
// busy mode).
//
// Run them with `make e2e`: e2e/run.sh installs what they need (Debian's
// chromium, tmux and an emoji font; Node 24, openclaw and playwright-core
// from npm into .e2e/), builds bin/gateway and runs `go test -tags e2e`.
// Artifacts (the web chat screenshots, the TUI screens, the gateway log) are
// written to artifacts/e2e/.
package e2e
