"""A file of finished grid tasks, so an interrupted study resumes and a changed model reruns.

One JSON line per task result, keyed by a hash of the task (point, policy,
step, seed, cost model) and of the source of every module a result depends on
(the simulator's model and the router's policies). Changing the replica model,
the workload or a policy changes every key, so stale results are never reused;
changing a table or a plot changes none. Lines are appended as results arrive.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..usage import UsageError

# sim modules that only present or schedule results: editing them keeps the cache
# (grid.py and sources.py decide what a task is: the task's own description carries their effect)
_PRESENTATION = {"__init__.py", "__main__.py", "cache.py", "cli.py", "criterion.py", "grid.py", "gridreport.py",
                 "parallel.py", "plots.py", "report.py", "runner.py", "sources.py", "stats.py", "verlplots.py",
                 "verlreport.py", "groupreport.py", "seedreport.py"}


def model_fingerprint() -> str:
    """A hash of the source of every module a task's result depends on."""
    root = Path(__file__).resolve().parent
    files = [f for f in sorted(root.glob("*.py")) if f.name not in _PRESENTATION]
    files += sorted((root.parent / "policy").glob("*.py"))
    h = hashlib.blake2b(digest_size=16)
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


class ResultCache:
    """Task results on disk; ``get`` misses for anything computed by another model."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.fingerprint = model_fingerprint()
        self._results: dict[str, Any] = {}
        if self.path.exists():
            for number, line in enumerate(self.path.read_text(errors="replace").splitlines(), 1):
                if line.strip():
                    self._read(number, line)

    def _read(self, number: int, line: str) -> None:
        """One row of the file; a file that is not a cache is a ``UsageError`` naming --cache, not a traceback."""
        try:
            row = json.loads(line)
            self._results[row["key"]] = row["result"]
        except (ValueError, KeyError, TypeError):
            raise UsageError(f"--cache {self.path}: line {number} is not a row this cache wrote; name another "
                             "file") from None

    def key(self, task_id: Any) -> str:
        text = json.dumps([self.fingerprint, task_id], sort_keys=True, default=str)
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    def get(self, task_id: Any) -> Any | None:
        return self._results.get(self.key(task_id))

    def put(self, task_id: Any, result: Any) -> None:
        key = self.key(task_id)
        self._results[key] = result
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as fh:
            fh.write(json.dumps({"key": key, "result": result}) + "\n")
