#!/usr/bin/env bash
# Schema validation of the Kubernetes manifests in deploy/k8s, offline.
# Sourced after scripts/common.sh (which defines CACHE, ROOT, log and
# ensure_python); defines validate_k8s_manifests.
#
# kubernetes-validate (PyPI) carries the JSON schemas of every Kubernetes
# version it supports, so only its installation needs the network. It runs
# in a small venv of its own in the cache, outside the clone.

# The validator, pinned, and the Kubernetes version validated against (one
# whose schemas that release bundles: `kubernetes-validate -k X.Y`).
K8S_VALIDATE_VERSION="1.37.0"
K8S_SCHEMA_VERSION="1.30"
K8S_VENV="${XDG_CACHE_HOME:-$HOME/.cache}/trainyard/venv-k8s"

# ensure_k8s_validate: the pinned kubernetes-validate in $K8S_VENV.
ensure_k8s_validate() {
  ensure_pinned_venv "$K8S_VENV" kubernetes-validate "$K8S_VALIDATE_VERSION" kubernetes-validate
}

# validate_k8s_manifests [DIR]: validates every object of every YAML file in
# DIR (default deploy/k8s) but kustomization.yaml, which is kustomize's and
# not a Kubernetes object, against the strict schemas of Kubernetes
# $K8S_SCHEMA_VERSION: unknown fields, wrong types and missing required fields
# fail. An object whose kind or apiVersion has no schema fails too
# (kubernetes-validate only warns about it). Prints one line with the count.
validate_k8s_manifests() {
  local dir="${1:-$ROOT/deploy/k8s}"
  ensure_k8s_validate
  local files=()
  local f
  while IFS= read -r f; do
    case "$(basename "$f")" in kustomization.yaml|kustomization.yml) continue ;; esac
    files+=("$f")
  done < <(find "$dir" -maxdepth 1 -type f \( -name '*.yaml' -o -name '*.yml' \) | sort)
  if [ ${#files[@]} -eq 0 ]; then
    log "k8s manifests: no YAML file in $dir"
    return 1
  fi
  # One run per file, so that a file the tool chokes on does not hide the
  # others. Each object gives one line: INFO when it passed; WARN (no schema
  # for its kind and apiVersion), ERROR or FATAL when not.
  local passed=0 failed=0 out rc n bad
  for f in "${files[@]}"; do
    rc=0
    out="$("$K8S_VENV/bin/kubernetes-validate" --strict -k "$K8S_SCHEMA_VERSION" "$f" 2>&1)" || rc=$?
    n="$(grep -c '^INFO ' <<<"$out" || true)"
    passed=$((passed + n))
    bad="$(grep -E "^(WARN|ERROR|FATAL) |^Couldn't " <<<"$out" || true)"
    if [ "$rc" -ne 0 ] || [ -n "$bad" ]; then
      failed=$((failed + 1))
      # The failures, or the end of what the tool printed when it gave none
      # (a traceback, unparsable YAML).
      printf '%s\n' "${bad:-$(tail -n 3 <<<"$out")}" >&2
    fi
  done
  if [ "$failed" -ne 0 ] || [ "$passed" -eq 0 ]; then
    log "k8s manifests: $failed of ${#files[@]} files invalid against Kubernetes $K8S_SCHEMA_VERSION ($passed objects passed)"
    return 1
  fi
  log "k8s manifests: $passed objects valid against Kubernetes $K8S_SCHEMA_VERSION (strict, ${#files[@]} files)"
}
