"""The router's hot state, one implementation each: the session table (``pins``), the load index (``loads``)
and in-flight ledger (``ledger``), the kept-pin rule (``kept``), the decision counters (``counters``), the
request path's tallies (``tallies``), one attempt's routing record (``routing``) and an answer below 400
recorded (``answers``), and the budget of request bytes held (``budget``).

The policy, the replica set, the metrics and the native lane all call these; nothing here imports the rest of
the router. Each module is plain Python with its declared interface beside it (a ``.pxd``). Where Cython and a
C compiler were there at install, ``hatch_build.py`` compiled them (and ``make native`` after an edit), and
import finds the compiled modules; the native lane calls them in C through the ``.pxd``. The Python source runs
instead where they are not built, with ``ROLLOUT_ROUTER_CORE=python`` (the tests run both builds), or when the
build is of other sources than those beside it (``sources``), so an edit is never shadowed by an old build.
The choice is all or nothing: compiled modules reach each other through their ``.pxd``.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from .sources import FOLDER, source_hash, why_stale

ENV = "ROLLOUT_ROUTER_CORE"  # "python": run the Python source even where the modules are compiled


def _record() -> ModuleType | None:
    """The build's record (``_built``, compiled beside the modules): the hash of the sources they were built from."""
    try:
        return importlib.import_module(f"{__name__}._built")
    except ImportError:
        return None


def _why_python() -> str | None:
    """Why core runs its Python source here (None: compiled)."""
    if os.environ.get(ENV) == "python":
        return f"{ENV}=python"
    try:
        current: str | None = source_hash()
    except OSError:  # an install that ships the compiled modules without all their sources: nothing to compare
        current = None
    return why_stale(_record(), current, "the compiled core")


WHY_PYTHON = _why_python()
COMPILED = WHY_PYTHON is None  # read once: a process runs the modules it imported


class _Source(importlib.abc.MetaPathFinder):
    """Finds this package's modules as Python source, ahead of their compiled builds."""

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        package, _, leaf = name.rpartition(".")
        source = FOLDER / f"{leaf}.py"
        if package != __name__ or not source.exists():
            return None
        return importlib.util.spec_from_file_location(name, source)


if not COMPILED:
    sys.meta_path.insert(0, _Source())
