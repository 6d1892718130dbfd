#!/usr/bin/env bash
# Build InfluxDB 1.8.10's server from the Go module proxy into a cache outside the
# repository, once. 1.8.10 is the last release that builds with Go alone (later ones need
# Rust for Flux); the tests use its v2-compatible API (/api/v2/write, /api/v2/query).
# Usage: build-influxd.sh [CACHE_DIR]; prints the path of the binary.
set -euo pipefail
version=1.8.10
cache="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/innet-agg/influxdb-$version}"
bin="$cache/bin/influxd"
if [ -x "$bin" ] && "$bin" version 2>/dev/null | grep -q "v$version"; then
  echo "$bin"
  exit 0
fi
# GO: the go to use (the Makefile passes its own); else PATH's, else the official tarball's
# /usr/local/go, which a new user's PATH may not have.
go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[ -x "$(command -v "$go" || true)" ] || { echo "build-influxd: Go is needed to build InfluxDB $version (https://go.dev/dl/); not at $go" >&2; exit 1; }
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/build.XXXXXX")"
echo "build-influxd: building influxd $version from the Go module proxy into $cache (3-5 minutes, once)" >&2
# Go compiles silently for minutes: say that it still runs.
# (sleep holds no output: a caller reading it is not kept waiting after the build)
( while sleep 30 >/dev/null 2>&1; do echo "build-influxd: still building ($SECONDS s)" >&2; done ) &
ticker=$!
trap 'kill $ticker 2>/dev/null; rm -rf "$tmp"' EXIT
# GOFLAGS=-mod=mod: a go.work or vendor directory around the caller must not interfere.
GOBIN="$tmp" GOFLAGS=-mod=mod GOWORK=off \
  "$go" install -ldflags "-X main.version=$version -X main.branch=$version -X main.commit=module-proxy" \
  "github.com/influxdata/influxdb/cmd/influxd@v$version" >&2
mkdir -p "$cache/bin"
mv "$tmp/influxd" "$bin"
"$bin" version >&2
echo "$bin"
