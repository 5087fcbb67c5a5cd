#!/usr/bin/env bash
# make cluster-e2e: the scale-out end-to-end suite (e2e/cluster/), after its
# make prerequisites (deps-postgres: Debian's PostgreSQL; bin/nats-server):
# installs Node 24 and openclaw into .e2e/ (e2e/node.sh, as make e2e does),
# builds bin/gateway and runs the suite with TURNGUARD_CLUSTER_E2E=1, under
# which nothing it needs may be missing. Each test's gateway logs go to
# artifacts/cluster-e2e/<test>/. Extra arguments go to go test (-run …).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
ARTIFACTS=$ROOT/artifacts/cluster-e2e
export PATH="$PATH:/usr/local/go/bin"

step() { printf '\n== cluster-e2e: %s\n' "$*"; }
die() { printf 'cluster-e2e: %s\n' "$*" >&2; exit 1; }

[ -x bin/nats-server ] || die "bin/nats-server is missing (make bin/nats-server)"
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || die "PostgreSQL is not installed (make deps-postgres)"

# shellcheck source=e2e/node.sh
. e2e/node.sh

step "build bin/gateway"
mkdir -p bin
go build -o bin/gateway ./cmd/gateway
rm -rf "$ARTIFACTS"
mkdir -p "$ARTIFACTS"

step "go test ./e2e/cluster/ ./cmd/loadtest/ (its -replicas mode at a tiny size)"
export TURNGUARD_CLUSTER_E2E=1
export TURNGUARD_REQUIRE_POSTGRES=1
export TURNGUARD_GATEWAY_BIN=$ROOT/bin/gateway
export TURNGUARD_NATS_SERVER=$ROOT/bin/nats-server
export TURNGUARD_NODE=$NODE
export TURNGUARD_OPENCLAW=$OPENCLAW
export TURNGUARD_CLUSTER_ARTIFACTS=$ARTIFACTS
go test -count=1 -v -timeout 20m ./e2e/cluster/ ./cmd/loadtest/ "$@"
echo "cluster-e2e: gateway logs in ${ARTIFACTS#"$ROOT"/}/"
