"""The hash of core's sources (``.py`` and ``.pxd``): what its build records (``_built``, compiled by
``hatch_build.py``, which loads this file by its path: the standard library only) and what ``core`` compares it
with before running the compiled modules."""
from __future__ import annotations

import hashlib
from pathlib import Path

FOLDER = Path(__file__).parent
COMPILED = ("changes", "budget", "counters", "replica", "loads", "pins", "kept", "ledger", "tallies", "routing", "answers")  # the modules Cython compiles, in an order they cimport


def source_hash(folder: Path = FOLDER) -> str:
    """The hash of the compiled modules' ``.py`` and ``.pxd``, in ``folder``."""
    digest = hashlib.sha256()
    for name in COMPILED:
        for suffix in (".py", ".pxd"):
            digest.update((folder / f"{name}{suffix}").read_bytes())
    return digest.hexdigest()[:16]


def why_stale(built: object | None, current: str | None, what: str) -> str | None:
    """Why the compiled build of ``what`` may not run (None: it may): it is not built (``built``: its module, or
    the record of its build, None when importing it failed), or it records other sources than ``current`` (the
    hash of those beside it; None where there are none to compare, an install that ships the build alone). Every
    compiled part of the router asks this, so none runs older than its sources."""
    if built is None:
        return f"{what} is not built (installing needs Cython and a C compiler)"
    if current is not None and current != getattr(built, "SOURCE_HASH", None):
        return f"{what} is older than its sources (run `make native`, or reinstall)"
    return None
