#!/usr/bin/env bash
# Builds h2spec (the HTTP/2 conformance suite) once into ~/.cache/rollout-router and prints its path.
# Later runs reuse the binary; `make test-h2spec` calls this, then the tier in tests/h2spec.
set -euo pipefail
VERSION="v2.2.1+incompatible"
DIR="${HOME}/.cache/rollout-router/h2spec-${VERSION%%+*}"
if [[ ! -x "${DIR}/h2spec" ]]; then
  mkdir -p "${DIR}"
  (cd "${DIR}" && GOBIN="${DIR}" GOFLAGS=-mod=mod go install "github.com/summerwind/h2spec/cmd/h2spec@${VERSION}") >&2
fi
echo "${DIR}/h2spec"
