"""The hash of core's sources (``.py`` and ``.pxd``): what its build records (``_built``, compiled by
``hatch_build.py``, which loads this file by its path: the standard library only) and what ``core`` compares it
with before running the compiled modules."""
from __future__ import annotations

import hashlib
from pathlib import Path

FOLDER = Path(__file__).parent
COMPILED = ("counters", "loads", "pins", "kept", "ledger", "tallies", "routing", "answers")  # the modules Cython compiles, in an order they cimport


def source_hash(folder: Path = FOLDER) -> str:
    """The hash of the compiled modules' ``.py`` and ``.pxd``, in ``folder``."""
    digest = hashlib.sha256()
    for name in COMPILED:
        for suffix in (".py", ".pxd"):
            digest.update((folder / f"{name}{suffix}").read_bytes())
    return digest.hexdigest()[:16]
