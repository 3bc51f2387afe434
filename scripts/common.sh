#!/usr/bin/env bash
# Shared helpers for the set-up, run and test scripts: where heavy one-time
# installs are cached (outside the clone) and how each is made idempotently.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/trainyard"
TORCH_VERSION="2.11.0"
VENV="$CACHE/venv-torch-$TORCH_VERSION"
mkdir -p "$CACHE"

log() { printf '\033[1;34m[trainyard]\033[0m %s\n' "$*" >&2; }

apt_install() {
  # apt_install PKG...: installs the Debian packages that are missing.
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]} with apt"
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

ensure_rust() {
  if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
  fi
  command -v cargo >/dev/null 2>&1 || {
    log "cargo not found: install Rust from your distribution or rustup first"; exit 1; }
}

ensure_python() {
  command -v python3 >/dev/null 2>&1 || apt_install python3 python3-venv
  python3 -m venv --help >/dev/null 2>&1 || apt_install python3-venv
}

# ensure_pinned_venv VENV PACKAGE VERSION EXE: a venv of its own in the
# cache holding PACKAGE==VERSION (from PyPI), made again when missing, of
# another version, or broken (an upgraded interpreter: EXE --version fails).
ensure_pinned_venv() {
  local venv=$1 pkg=$2 version=$3 exe=$4
  ensure_python
  local marker="$venv/.complete-$version"
  if [ -f "$marker" ] && "$venv/bin/$exe" --version >/dev/null 2>&1; then
    return 0
  fi
  log "installing $pkg==$version into $venv (one time)"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "$pkg==$version"
  touch "$marker"
}

# ensure_torch: a virtualenv with PyTorch (the libtorch that tch links) in the cache.
ensure_torch() {
  ensure_python
  if [ -f "$VENV/.complete" ]; then
    # Added later: safetensors, for the tests that read weights in Python.
    "$VENV/bin/python" -c 'import safetensors' 2>/dev/null || "$VENV/bin/pip" install -q safetensors
    return 0
  fi
  log "installing torch==$TORCH_VERSION into $VENV (one time, ~5 GB)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" numpy safetensors
  touch "$VENV/.complete"
}

# torch_env: the environment a build and a run of the executor need.
torch_env() {
  export LIBTORCH_USE_PYTORCH=1
  export PATH="$VENV/bin:$PATH"
  local lib
  lib="$("$VENV/bin/python" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
  export LIBTORCH_LIB_DIR="$lib"
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# ensure_pytest: what the Python test suite (tests/pytest) needs (and the
# e2e tests' pyarrow), in the
# torch venv "$VENV" (after ensure_torch): pytest, the SDK's dependencies,
# the generated client's runtime (httpx, attrs, python-dateutil), hatchling
# to build the SDK offline, and the SDK itself (./sdk/python), reinstalled
# every time so that the suite tests this clone's SDK. PyPI is asked only
# when a package is missing.
ensure_pytest() {
  local py="$VENV/bin/python"
  if ! "$py" -c 'import pytest, requests, safetensors, tqdm, httpx, attrs, dateutil, hatchling, pyarrow, polars, pandas, duckdb, PIL' 2>/dev/null; then
    log "installing pytest and the Python SDK's dependencies into $VENV"
    # pyarrow, polars, pandas, DuckDB and Pillow: the data tests read files
    # as other tools write them (Parquet from each writer, JPEG and PNG).
    "$VENV/bin/pip" install -q --disable-pip-version-check \
      pytest requests safetensors tqdm httpx attrs python-dateutil hatchling pyarrow \
      polars pandas duckdb pillow
  fi
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation \
    --force-reinstall "$ROOT/sdk/python"
  ensure_uv
}

# UV_VERSION: the uv executors install scripts' own packages with (found
# beside the runtime's Python, in the venv's bin/).
UV_VERSION=0.13.9
ensure_uv() {
  if [ "$("$VENV/bin/uv" --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
    log "installing uv==$UV_VERSION into $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "uv==$UV_VERSION"
  fi
}

# ensure_postgres_binaries: initdb/pg_ctl/psql from Debian's packages when missing.
ensure_postgres_binaries() {
  if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v psql >/dev/null 2>&1; then
    return 0
  fi
  apt_install postgresql postgresql-client
}

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }

# as_pg_user CMD...: PostgreSQL refuses to run as root; run it as `postgres` then.
as_pg_user() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# ensure_test_postgres: exports TRAINYARD_TEST_DATABASE_URL, an admin URL of
# a running server: the one given, else the test suite's private cluster,
# started here when it is not running (stopped by stop_test_postgres).
#
# Never the machine's own Postgres: users' scripts run in these tests, and
# that server (trust auth on 127.0.0.1:5432 and /var/run/postgresql, as
# Debian's often is) would be theirs to write to. The private cluster asks
# for a password (SCRAM) over TCP and over its socket; both the socket and
# the password (generated once, mode 0600) are in its folder (mode 0700):
# /var/lib/trainyard/test-postgres as root, $CACHE/test-postgres otherwise,
# with the cluster itself in data/. trainyard-testdb finds it there too.
# A cluster made by an older version (trust auth) is made again.
TEST_PG_PORT=55432
TEST_PG_STARTED=""
test_pg_dir() {
  if [ "$(id -u)" -eq 0 ]; then echo /var/lib/trainyard/test-postgres; else echo "$CACHE/test-postgres"; fi
}
ensure_test_postgres() {
  if [ -n "${TRAINYARD_TEST_DATABASE_URL:-}" ]; then return 0; fi
  local dir bin pw
  dir="$(test_pg_dir)"
  bin="$(pg_bin)"
  if [ -f "$dir/PG_VERSION" ] || [ ! -s "$dir/password" ] || [ ! -f "$dir/data/PG_VERSION" ] ||
    grep -Eq '^[^#]*[[:space:]]trust([[:space:]]|$)' "$dir/data/pg_hba.conf" 2>/dev/null; then
    # Missing, half made, or made by an older version: the cluster was
    # data/ itself then, with trust auth. Test data only: start afresh.
    local old
    for old in "$dir" "$dir/data"; do
      if [ -f "$old/postmaster.pid" ]; then
        (cd / && as_pg_user "$bin/pg_ctl" -D "$old" -m fast -w stop >/dev/null 2>&1) || true
      fi
    done
    [ -e "$dir" ] && log "making the test suite's Postgres cluster in $dir again (it asked for no password)"
    rm -rf "$dir"
    log "creating a private Postgres cluster for tests in $dir"
    mkdir -p "$(dirname "$dir")"
    mkdir -m 700 "$dir"
    [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$dir"
    # 32 random bytes in hex: nothing to escape in a URL.
    pw="$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"
    (umask 077 && printf '%s\n' "$pw" >"$dir/password")
    [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$dir/password"
    (cd / && as_pg_user "$bin/initdb" -D "$dir/data" -U postgres --pwfile="$dir/password" \
      --auth=scram-sha-256 --encoding=UTF8 >/dev/null)
  fi
  chmod 700 "$dir"
  chmod 600 "$dir/password"
  pw="$(tr -d '[:space:]' <"$dir/password")"
  if ! (cd / && as_pg_user "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1); then
    (cd / && as_pg_user "$bin/pg_ctl" -D "$dir/data" -w -t 60 -l "$dir/server.log" \
      -o "-p $TEST_PG_PORT -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off" start >/dev/null)
    TEST_PG_STARTED="$dir/data"
  fi
  export TRAINYARD_TEST_DATABASE_URL="postgres://postgres:$pw@127.0.0.1:$TEST_PG_PORT/postgres"
  # Its socket's folder: the network attack suite tries that path too.
  export TRAINYARD_TEST_PG_SOCKET_DIR="$dir"
  log "tests use a private Postgres cluster at 127.0.0.1:$TEST_PG_PORT (password in $dir/password)"
}

stop_test_postgres() {
  if [ -n "$TEST_PG_STARTED" ]; then
    (cd / && as_pg_user "$(pg_bin)/pg_ctl" -D "$TEST_PG_STARTED" -m fast -w stop >/dev/null 2>&1) || true
  fi
}

drop_test_databases() {
  local dbs
  dbs=$(psql "$TRAINYARD_TEST_DATABASE_URL" -Atqc "select datname from pg_database where datname like 'ty\_test\_%'" 2>/dev/null || true)
  for db in $dbs; do
    psql "$TRAINYARD_TEST_DATABASE_URL" -qc "drop database if exists \"$db\" with (force)" >/dev/null 2>&1 || true
  done
}

# ensure_browser_tests: what the web UI's browser tests need — Debian's
# Chromium, Node, and playwright-core (pinned) in the cache, outside the
# clone. Exports TRAINYARD_CHROMIUM and TRAINYARD_NODE_MODULES for them.
# The pinned version still runs on Node 18 (Debian 12's nodejs).
PLAYWRIGHT_VERSION="1.61.1"
NODE_DIR="$CACHE/node"
ensure_browser_tests() {
  command -v chromium >/dev/null 2>&1 || apt_install chromium
  command -v node >/dev/null 2>&1 || apt_install nodejs
  command -v npm >/dev/null 2>&1 || apt_install npm
  local pkg="$NODE_DIR/node_modules/playwright-core/package.json"
  if ! grep -q "\"version\": \"$PLAYWRIGHT_VERSION\"" "$pkg" 2>/dev/null; then
    log "installing playwright-core@$PLAYWRIGHT_VERSION into $NODE_DIR"
    mkdir -p "$NODE_DIR"
    (cd "$NODE_DIR" && npm install --no-audit --no-fund --silent "playwright-core@$PLAYWRIGHT_VERSION")
  fi
  export TRAINYARD_CHROMIUM
  TRAINYARD_CHROMIUM="$(command -v chromium)"
  export TRAINYARD_NODE_MODULES="$NODE_DIR/node_modules"
}
