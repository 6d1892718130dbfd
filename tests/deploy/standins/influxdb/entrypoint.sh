#!/bin/sh
# InfluxDB 1.8.10 as influxdb:2.7 would start for compose: the data in /var/lib/influxdb2,
# and on the first start (no database yet) the bucket DOCKER_INFLUXDB_INIT_BUCKET created
# as a database with DOCKER_INFLUXDB_INIT_RETENTION (the 2.x API maps bucket "b" to it).
set -eu
export INFLUXDB_DATA_DIR=/var/lib/influxdb2/data
export INFLUXDB_DATA_WAL_DIR=/var/lib/influxdb2/wal
export INFLUXDB_META_DIR=/var/lib/influxdb2/meta
export INFLUXDB_HTTP_BIND_ADDRESS=:8086
export INFLUXDB_HTTP_FLUX_ENABLED=true
export INFLUXDB_REPORTING_DISABLED=true
export INFLUXDB_HTTP_LOG_ENABLED=false
influxd &
pid=$!
trap 'kill -TERM $pid; wait $pid' TERM INT
bucket="${DOCKER_INFLUXDB_INIT_BUCKET:-}"
if [ -n "$bucket" ]; then
  python3 - "$bucket" "${DOCKER_INFLUXDB_INIT_RETENTION:-0s}" <<'PY'
import sys, time, urllib.parse, urllib.request
bucket, retention = sys.argv[1], sys.argv[2]
for _ in range(600):
    try:
        urllib.request.urlopen("http://127.0.0.1:8086/ping", timeout=1)
        break
    except OSError:
        time.sleep(0.1)
duration = "INF" if retention in ("", "0", "0s") else retention
q = f'CREATE DATABASE "{bucket}" WITH DURATION {duration} NAME "autogen"'
urllib.request.urlopen("http://127.0.0.1:8086/query", urllib.parse.urlencode({"q": q}).encode())
print(f"stand-in: bucket {bucket!r} ready (retention {duration})", flush=True)
PY
fi
wait $pid
