"""The real-vLLM tier is opt-in: ``ROLLOUT_ROUTER_REAL_VLLM=1`` (``make test-vllm`` sets it).

Without the variable nothing here is collected, so ``make test`` neither runs nor lists these
tests. With it, a missing prerequisite (the vLLM virtualenv, the tiny model) fails the run loudly
at collection, naming the command that prepares it; it is never skipped.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV = "ROLLOUT_ROUTER_REAL_VLLM"
ROOT = Path(__file__).resolve().parents[2]


def enabled() -> bool:
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


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
    config.addinivalue_line("markers", f"realvllm: runs against real vLLM servers on the CPU (opt-in: {ENV}=1)")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Off unless asked for: the files here are not even imported."""
    if not enabled() and collection_path.name != "conftest.py":
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not enabled():
        return
    problems = missing_prerequisites()
    if problems and any(item.get_closest_marker("realvllm") for item in items):
        raise pytest.UsageError(
            f"{ENV}=1 but the real-vLLM tier cannot run: " + "; ".join(problems)
            + ". Prepare it with `bash tests/realvllm/setup.sh` (or `make test-vllm`).")
