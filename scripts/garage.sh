#!/usr/bin/env bash
# A real single-node Garage S3 server on loopback for the tests. Source it
# after common.sh (it uses CACHE, log and ensure_rust from there).
#   ensure_garage       builds (once) and caches the garage binary; exports GARAGE_BIN
#   start_test_s3 DIR   starts a fresh server in DIR (wiped first) with a key and
#                       a bucket `trainyard`; exports TRAINYARD_TEST_S3_*
#   stop_test_s3        stops that server (safe to call when none was started)

GARAGE_VERSION="2.5.0"
GARAGE_ROOT="$CACHE/garage-$GARAGE_VERSION"
TEST_S3_PID=""

# ensure_garage: "$GARAGE_ROOT/bin/garage", built by cargo install the first
# time (a binary copied there by hand is accepted as well).
ensure_garage() {
  export GARAGE_BIN="$GARAGE_ROOT/bin/garage"
  [ -x "$GARAGE_BIN" ] && return 0
  ensure_rust
  log "building garage $GARAGE_VERSION into $GARAGE_ROOT (one time, ~25 min on 2 cores)"
  cargo install garage --locked --version "$GARAGE_VERSION" --root "$GARAGE_ROOT"
}

# _test_s3_ready ADMIN_PORT S3_PORT: the admin API's unauthenticated /health
# says 200 and the S3 port answers HTTP at all (unsigned requests get 403).
_test_s3_ready() {
  curl -sf -o /dev/null "http://127.0.0.1:$1/health" && curl -s -o /dev/null "http://127.0.0.1:$2/"
}

# start_test_s3 DIR: the server listens on three free ports of 127.0.0.1.
# `garage server --single-node --default-bucket` assigns the layout, imports
# the key and creates the bucket (read, write, owner) before it serves S3.
start_test_s3() {
  local dir="${1:?start_test_s3 needs a directory}" ports s3_port rpc_port admin_port key secret i
  ensure_garage
  stop_test_s3
  [ "$dir" != "/" ] || { log "start_test_s3: refusing to wipe /"; return 1; }
  rm -rf "$dir" && mkdir -p "$dir" && dir="$(cd "$dir" && pwd)"
  # Bound together so that the three ports differ; released just before garage binds them.
  ports="$(python3 -c 'import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')"
  read -r s3_port rpc_port admin_port <<<"$ports"
  key="GK$(od -An -tx1 -N12 /dev/urandom | tr -d ' \n')"
  secret="$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"
  cat >"$dir/garage.toml" <<EOF
metadata_dir = "$dir/meta"
data_dir = "$dir/data"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:$rpc_port"
rpc_public_addr = "127.0.0.1:$rpc_port"
rpc_secret = "$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"

[s3_api]
api_bind_addr = "127.0.0.1:$s3_port"
s3_region = "garage"

[admin]
api_bind_addr = "127.0.0.1:$admin_port"
EOF
  chmod 600 "$dir/garage.toml"
  GARAGE_DEFAULT_ACCESS_KEY="$key" GARAGE_DEFAULT_SECRET_KEY="$secret" GARAGE_DEFAULT_BUCKET=trainyard \
    "$GARAGE_BIN" -c "$dir/garage.toml" server --single-node --default-bucket \
    </dev/null >"$dir/garage.log" 2>&1 &
  TEST_S3_PID=$!
  for ((i = 0; i < 300; i++)); do
    _test_s3_ready "$admin_port" "$s3_port" && break
    kill -0 "$TEST_S3_PID" 2>/dev/null || break
    sleep 0.1
  done
  if ! _test_s3_ready "$admin_port" "$s3_port"; then
    log "garage did not start; the end of $dir/garage.log:"
    tail -n 20 "$dir/garage.log" >&2
    stop_test_s3
    return 1
  fi
  export TRAINYARD_TEST_S3_URL="s3://trainyard"
  export TRAINYARD_TEST_S3_ENDPOINT="http://127.0.0.1:$s3_port"
  export TRAINYARD_TEST_S3_REGION="garage"
  export TRAINYARD_TEST_S3_ACCESS_KEY_ID="$key"
  export TRAINYARD_TEST_S3_SECRET_ACCESS_KEY="$secret"
  log "tests use a Garage S3 server at $TRAINYARD_TEST_S3_ENDPOINT (bucket trainyard, log $dir/garage.log)"
}

# stop_test_s3: SIGTERM (garage shuts down cleanly), SIGKILL after 10 s.
stop_test_s3() {
  [ -n "$TEST_S3_PID" ] || return 0
  local pid="$TEST_S3_PID" i
  TEST_S3_PID=""
  kill "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
