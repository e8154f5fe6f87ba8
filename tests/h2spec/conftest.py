"""The HTTP/2 conformance tier is opt-in: ``ROLLOUT_ROUTER_H2SPEC=/path/to/h2spec`` (``make test-h2spec`` builds
the binary with Go and sets it).

Without the variable nothing here is collected, so ``make test`` neither runs nor lists these tests and needs
no Go. With it, a binary that is not there fails the run at collection, naming the command that fixes it.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV = "ROLLOUT_ROUTER_H2SPEC"


def binary() -> Path | None:
    value = os.environ.get(ENV, "").strip()
    return Path(value) if value else None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Off unless asked for: the files here are not even imported."""
    if binary() is None and collection_path.name != "conftest.py":
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = binary()
    if path is not None and not os.access(path, os.X_OK):
        raise pytest.UsageError(f"{ENV}={path} but no h2spec binary is there. Run the tier with `make test-h2spec` "
                                "(it builds h2spec with Go into ~/.cache/rollout-router first).")
