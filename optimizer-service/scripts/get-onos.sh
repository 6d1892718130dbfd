#!/usr/bin/env bash
# ONOS 2.7.0 for the tests against a real ONOS: the unpacked release tree in a cache outside
# the repository. Public Maven repositories do not serve the release tarball (404), so on
# most machines that tree is ONOS built from its public source, outside the repository, and
# unpacked there (docs/service.md, "Testing against ONOS"); this script then only finds it.
# Where the Maven repository this machine's Maven uses does serve the tarball (a mirror of
# ONOS's release repository), it is downloaded there once. The tarball is not an artifact
# Maven can resolve by coordinates (its file name lacks the artifactId), so the URL is derived
# from Maven's own configuration: a mirror of `central` (or `*`, `external:*`) in
# ~/.m2/settings.xml or $MAVEN_HOME/conf/settings.xml, else the `central` repository of
# Maven's super POM. Usage: get-onos.sh [CACHE_DIR]; prints ONOS's directory.
set -euo pipefail
version=2.7.0
cache="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/innet-agg/onos-$version}"
dir="$cache/onos-$version"
if [ -x "$dir/bin/onos-service" ]; then
  echo "$dir"
  exit 0
fi
here="$(cd "$(dirname "$0")" && pwd)"
base="$(python3 "$here/maven_repo_url.py")"
path="org/onosproject/onos-releases/$version/onos-$version.tar.gz"
mkdir -p "$cache"
echo "get-onos: downloading $base/$path" >&2
if ! curl -fSL --retry 3 --connect-timeout 20 -o "$cache/onos.tar.gz.part" "$base/$path"; then
  rm -f "$cache/onos.tar.gz.part"
  echo "get-onos: no ONOS at $dir, and $base/$path is not available from this machine's" \
    "Maven repository; build ONOS 2.7.0 from its public source and unpack its release" \
    "tree there (docs/service.md). The tests against a real ONOS skip until then." >&2
  exit 3
fi
if sha1="$(curl -fsSL "$base/$path.sha1" 2>/dev/null)"; then
  echo "${sha1%% *}  $cache/onos.tar.gz.part" | sha1sum -c --quiet - >&2
fi
tar -xzf "$cache/onos.tar.gz.part" -C "$cache"
rm -f "$cache/onos.tar.gz.part"
echo "$dir"
