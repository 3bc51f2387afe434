//! Shared pieces of Trainyard's benchmarks (`bench/`): how a figure is
//! printed and recorded, so that every benchmark binary reports the same
//! way and `bench/run` can gather them into `docs/BENCHMARKS.md`.
//!
//! A figure is one measured value beside the baseline (or ceiling, or
//! target) it is read against, measured in the same invocation. It prints
//! as `name: value unit (baseline value unit, ratio r)`; when
//! `TRAINYARD_BENCH_DIR` is set it is also appended, as one JSON object, to
//! `$TRAINYARD_BENCH_DIR/figures.jsonl`, and a benchmark's raw series (for
//! plots) go to `$TRAINYARD_BENCH_DIR/<bench>.json`.

pub mod figure;
pub mod server;
