#!/usr/bin/env bash
# The Python client generator that tests/pytest/test_generated_client.py
# runs against openapi/openapi.json, to prove the document is usable by a
# real generator (unique operationIds, one distinctly named model per
# variant). Sourced after scripts/common.sh (CACHE, ensure_pinned_venv);
# defines ensure_openapi_python_client.
#
# ensure_openapi_python_client installs openapi-python-client (PyPI) at a
# pinned version into a venv of its own in the cache, idempotently, and
# exports TRAINYARD_OPENAPI_PYTHON_CLIENT, the path of its executable, which
# the test reads. The generated client's own runtime dependencies (httpx,
# attrs, python-dateutil) belong in the venv that runs pytest, not here.

OPENAPI_PYTHON_CLIENT_VERSION="0.29.1"
OPENAPI_PYTHON_CLIENT_VENV="$CACHE/openapi-python-client"

ensure_openapi_python_client() {
  ensure_pinned_venv "$OPENAPI_PYTHON_CLIENT_VENV" openapi-python-client \
    "$OPENAPI_PYTHON_CLIENT_VERSION" openapi-python-client
  export TRAINYARD_OPENAPI_PYTHON_CLIENT="$OPENAPI_PYTHON_CLIENT_VENV/bin/openapi-python-client"
}
