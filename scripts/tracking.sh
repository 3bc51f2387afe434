#!/usr/bin/env bash
# The experiment trackers' side of the tests: a virtualenv of its own in the
# cache with MLflow (the tracking server the end-to-end test starts, and the
# Python client that reads runs back) and TensorBoard (its EventAccumulator
# reads the tfevents files of GET /v1/jobs/{id}/tensorboard). Kept apart
# from the torch venv so that neither's pins move the other's. Sourced by
# scripts/test after common.sh (it uses CACHE, log and ensure_python).
#
#   ensure_tracking   installs (once) the pinned versions; exports
#                     TRAINYARD_TRACKING_PYTHON for tests/e2e/tracking.rs

# 3.17.2: 3.18.0 needs mlflow-tracing==3.18.0, which PyPI does not have.
MLFLOW_VERSION="3.17.2"
TENSORBOARD_VERSION="2.21.0"
TRACKING_VENV="$CACHE/venv-tracking-mlflow-$MLFLOW_VERSION-tb-$TENSORBOARD_VERSION"

ensure_tracking() {
  ensure_python
  local marker="$TRACKING_VENV/.complete"
  if [ -f "$marker" ] && "$TRACKING_VENV/bin/python" -c 'import mlflow, tensorboard' >/dev/null 2>&1; then
    export TRAINYARD_TRACKING_PYTHON="$TRACKING_VENV/bin/python"
    return 0
  fi
  log "installing mlflow==$MLFLOW_VERSION and tensorboard==$TENSORBOARD_VERSION into $TRACKING_VENV (one time)"
  rm -rf "$TRACKING_VENV"
  python3 -m venv "$TRACKING_VENV"
  "$TRACKING_VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip
  "$TRACKING_VENV/bin/pip" install -q --disable-pip-version-check \
    "mlflow==$MLFLOW_VERSION" "tensorboard==$TENSORBOARD_VERSION"
  touch "$marker"
  export TRAINYARD_TRACKING_PYTHON="$TRACKING_VENV/bin/python"
}
