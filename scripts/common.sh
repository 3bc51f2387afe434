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

# ensure_torch: a virtualenv with PyTorch (the libtorch that tch links) in the cache.
ensure_torch() {
  ensure_python
  if [ -f "$VENV/.complete" ]; then return 0; fi
  log "installing torch==$TORCH_VERSION into $VENV (one time, ~5 GB)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" numpy
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
