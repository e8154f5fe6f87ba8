"""The switch the opt-in tiers share (``tests/realk8s``, ``tests/realvllm``): an environment variable turns a tier on.

Off, a tier's files are not even imported, so ``make test`` neither runs nor lists them and needs none of what
they need. On, a missing prerequisite fails the run at collection, naming the command that prepares it: a tier
asked for is never skipped.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class OptInTier:
    env: str  # the variable that turns the tier on: 1, true, yes or on
    marker: str
    runs: str  # what the marker's tests run against, for ``pytest --markers``

    def enabled(self) -> bool:
        return os.environ.get(self.env, "").strip().lower() in ("1", "true", "yes", "on")

    def configure(self, config: pytest.Config) -> None:
        config.addinivalue_line("markers", f"{self.marker}: {self.runs} (opt-in: {self.env}=1)")

    def ignore(self, collection_path: Path) -> bool | None:
        """True for every file but the conftest while the tier is off (pytest's ``pytest_ignore_collect``)."""
        return True if not self.enabled() and collection_path.name != "conftest.py" else None

    def refuse(self, tier: str, problems: list[str], fix: str) -> None:
        """Fail the run when the tier is on and ``problems`` is not empty; ``fix`` says how to prepare it."""
        if problems:
            raise pytest.UsageError(f"{self.env}=1 but {tier} cannot run: " + "; ".join(problems) + f". {fix}")
