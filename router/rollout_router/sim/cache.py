"""A file of finished grid tasks, so an interrupted study resumes and a changed model reruns.

One JSON line per task result, keyed by a hash of the task (point, policy,
step, seed, cost model) and of the source of every module a result depends on
(the simulator's model, the router's policies and their hot state in ``core``).
Changing the replica model, the workload or a policy changes every key, so stale
results are never reused; changing a table or a plot changes none. Lines are
appended as results arrive. A change that keeps every result (a refactor) is
carried over by ``sim.rekey``: it re-runs a sample, and re-keys the rest only if
the sample is identical.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterable
from fnmatch import fnmatchcase as fnmatch
from pathlib import Path
from typing import Any

from ..usage import UsageError

# sim modules that only present or schedule results: editing them keeps the cache
# (grid.py and sources.py decide what a task is: the task's own description carries their effect)
_PRESENTATION = {"__init__.py", "__main__.py", "cache.py", "cli.py", "criterion.py", "grid.py", "gridreport.py",
                 "parallel.py", "plots.py", "report.py", "rekey.py", "runner.py", "sources.py", "stats.py",
                 "verlplots.py", "verlreport.py", "groupreport.py", "seedreport.py"}
# The package's folders whose source a result depends on besides sim's model, with the file names each contributes:
# the policies, and the policies' hot state (core: pure Python, or Cython's .pyx and the .pxd that types a .py).
# A folder that does not exist contributes nothing. Its files are hashed under their names, core's with "core/".
_DEPENDED_ON = (("policy", ("*.py",), ""), ("core", ("*.py", "*.pxd", "*.pyx"), "core/"))
_FOLDERS = ("sim", *(folder for folder, _, _ in _DEPENDED_ON))
# core's files that choose or record which build runs, not what it computes (both builds compute the same:
# tests/test_core.py): editing them keeps the cache
_BUILD_CHOICE = {("core", "__init__.py"), ("core", "sources.py"), ("core", "_built.pyx")}


def _model_files(names: dict[str, list[str]]) -> list[tuple[str, str]]:
    """The rule, over the file names of ``sim`` and of each ``_DEPENDED_ON`` folder: (folder, file name) of every
    file hashed, in the order hashed."""
    files = [("sim", n) for n in sorted(names.get("sim", ())) if fnmatch(n, "*.py") and n not in _PRESENTATION]
    for folder, patterns, _ in _DEPENDED_ON:
        files += [(folder, n) for n in sorted(names.get(folder, ()))
                  if any(fnmatch(n, p) for p in patterns) and (folder, n) not in _BUILD_CHOICE]
    return files


def _hash(files: Iterable[tuple[str, str, bytes]]) -> str:
    prefixes = {folder: prefix for folder, _, prefix in _DEPENDED_ON}
    h = hashlib.blake2b(digest_size=16)
    for folder, name, data in files:
        h.update((prefixes.get(folder, "") + name).encode() + b"\0" + data + b"\0")
    return h.hexdigest()


def model_fingerprint(package: Path | None = None) -> str:
    """A hash of the source of every module a task's result depends on, as this tree holds it (``package``: the
    ``rollout_router`` folder to read, by default this one)."""
    package = package or Path(__file__).resolve().parent.parent
    names = {folder: [f.name for f in (package / folder).glob("*") if f.is_file()] for folder in _FOLDERS}
    return _hash((folder, name, (package / folder / name).read_bytes()) for folder, name in _model_files(names))


def fingerprint_at(rev: str, package: Path | None = None) -> str:
    """The fingerprint ``model_fingerprint`` gives, by today's rule, for the tree at git revision ``rev`` of the
    repository holding ``package`` (by default this package), read with git (``ls-tree``, ``show``) without
    checking it out. A ``LookupError`` (its message: what is wrong with ``rev``) if there is no such commit."""
    package = (package or Path(__file__).resolve().parent.parent).resolve()
    try:
        top = Path(_git(package, "rev-parse", "--show-toplevel").decode().strip())
    except (OSError, subprocess.CalledProcessError):
        raise LookupError(f"no git repository holds {package} (run from a checkout, with git installed)") from None
    try:
        commit = _git(top, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}").decode().strip()
    except subprocess.CalledProcessError:
        raise LookupError(f"not a revision of the repository at {top}") from None
    prefix = package.relative_to(top).as_posix()
    listing = _git(top, "ls-tree", "-z", "--full-tree", commit, "--", *(f"{prefix}/{f}/" for f in _FOLDERS))
    names: dict[str, list[str]] = {}
    for entry in filter(None, listing.split(b"\0")):
        meta, path = entry.decode().split("\t", 1)
        if meta.split()[1] == "blob":
            folder, name = path[len(prefix) + 1:].split("/", 1)
            names.setdefault(folder, []).append(name)
    return _hash((folder, name, _git(top, "show", f"{commit}:{prefix}/{folder}/{name}"))
                 for folder, name in _model_files(names))


def _git(where: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(where), *args], check=True, capture_output=True).stdout


def task_key(fingerprint: str, task_id: Any) -> str:
    """The cache's key of a task computed by the model of ``fingerprint``."""
    text = json.dumps([fingerprint, task_id], sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


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
        return task_key(self.fingerprint, task_id)

    def get(self, task_id: Any) -> Any | None:
        return self._results.get(self.key(task_id))

    def stored(self, key: str) -> Any | None:
        """The result under ``key`` (a ``task_key``, of whichever model)."""
        return self._results.get(key)

    def put(self, task_id: Any, result: Any) -> None:
        self.put_keyed([(self.key(task_id), result)])

    def put_keyed(self, rows: Iterable[tuple[str, Any]]) -> None:
        """Append results under keys already made (``task_key``), in one write."""
        text = ""
        for key, result in rows:
            self._results[key] = result
            text += json.dumps({"key": key, "result": result}) + "\n"
        if not text:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as fh:
            fh.write(text)
