"""The real-vLLM tier is opt-in: ``ROLLOUT_ROUTER_REAL_VLLM=1`` (``make test-vllm`` sets it).

Its prerequisites are the vLLM virtualenv and the tiny model (tests/opt_in.py: without the variable nothing
here is collected; with it, a missing prerequisite fails the run at collection).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.opt_in import OptInTier

TIER = OptInTier("ROLLOUT_ROUTER_REAL_VLLM", "realvllm", "runs against real vLLM servers on the CPU")
ENV, enabled = TIER.env, TIER.enabled
ROOT = Path(__file__).resolve().parents[2]


def _from_root(variable: str, default: str) -> Path:
    path = Path(os.environ.get(variable) or default)
    return path if path.is_absolute() else ROOT / path


VLLM_VENV = _from_root("VLLM_VENV", ".venv-vllm")
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
TINY_MODEL_DIR = _from_root("TINY_MODEL_DIR", ".cache/tiny-model")
LOG_DIR = _from_root("REAL_VLLM_LOG_DIR", "out/realvllm")


def missing_prerequisites() -> list[str]:
    problems = []
    if not VLLM_PYTHON.exists():
        problems.append(f"no vLLM virtualenv at {VLLM_VENV} ({VLLM_PYTHON} missing)")
    elif not (VLLM_VENV / ".installed-realvllm").exists():
        problems.append(f"{VLLM_VENV} exists but its install did not finish (.installed-realvllm missing)")
    if not (TINY_MODEL_DIR / "config.json").exists() or not (TINY_MODEL_DIR / "tokenizer.json").exists():
        problems.append(f"no tiny model in {TINY_MODEL_DIR}")
    return problems


def pytest_configure(config: pytest.Config) -> None:
    TIER.configure(config)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    return TIER.ignore(collection_path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if enabled() and any(item.get_closest_marker("realvllm") for item in items):
        TIER.refuse("the real-vLLM tier", missing_prerequisites(),
                    "Prepare it with `bash tests/realvllm/setup.sh` (or `make test-vllm`).")
