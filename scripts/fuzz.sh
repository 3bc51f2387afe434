#!/usr/bin/env bash
# Coverage-guided fuzzing of the data plane's decoders with cargo-fuzz
# (libFuzzer). Sourced after scripts/common.sh (CACHE, ROOT, log); defines
# fuzz_dataplane.
#
# The target (dataplane/fuzz/fuzz_targets/frames.rs) feeds arbitrary bytes
# to the ring frame header decoder, the handshake's hello decoder and the
# PS reader (headers and payloads from a stream), asserting no panic, the
# length bounds and encode/decode round trips. cargo-fuzz is installed once
# into the cache; its sanitizer flags are nightly-only, so the build runs
# with RUSTC_BOOTSTRAP=1 on the machine's stable toolchain. The corpus
# (dataplane/fuzz/corpus, not committed) grows from run to run; a crash
# leaves its input in dataplane/fuzz/artifacts and fails the run.

CARGO_FUZZ_VERSION="0.13.2"
CARGO_FUZZ_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/trainyard/cargo-fuzz-$CARGO_FUZZ_VERSION"

ensure_cargo_fuzz() {
  if [ -x "$CARGO_FUZZ_ROOT/bin/cargo-fuzz" ]; then
    return 0
  fi
  log "installing cargo-fuzz $CARGO_FUZZ_VERSION into $CARGO_FUZZ_ROOT (one time)"
  cargo install --quiet --locked cargo-fuzz --version "$CARGO_FUZZ_VERSION" --root "$CARGO_FUZZ_ROOT"
}

# fuzz_dataplane [SECONDS]: builds and runs the target for SECONDS
# (default TRAINYARD_FUZZ_SECONDS, else 30); prints the inputs tried.
fuzz_dataplane() {
  local seconds="${1:-${TRAINYARD_FUZZ_SECONDS:-30}}" out status=0
  ensure_cargo_fuzz
  out=$(mktemp)
  (cd "$ROOT/dataplane" && RUSTC_BOOTSTRAP=1 "$CARGO_FUZZ_ROOT/bin/cargo-fuzz" run frames -- \
    -max_total_time="$seconds" -print_final_stats=1) >"$out" 2>&1 || status=$?
  local runs
  runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 inputs in \2 s/p' "$out" | tail -1 || true)
  if [ "$status" -ne 0 ]; then
    tail -40 "$out" >&2
    log "cargo-fuzz (data-plane decoders): FAILED (exit $status); the input is in dataplane/fuzz/artifacts"
  else
    log "cargo-fuzz (data-plane decoders): ${runs:-? inputs}, no crash"
  fi
  rm -f "$out"
  return $status
}
