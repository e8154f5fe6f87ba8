"""The hash of the native lane's sources: what the built module records (``hatch_build.py``, which loads this
file by its path at install, before the package's dependencies are there: the standard library only) and what
``lane.unavailable`` checks, so a router never runs a lane older than the sources beside it."""
from __future__ import annotations

import hashlib
from pathlib import Path

FOLDER = Path(__file__).parent


def source_hash(folder: Path = FOLDER) -> str:
    """The hash of ``_lane.pyx``, the ``.pxi`` files it includes and the core's ``.pxd`` it cimports (a changed
    interface needs the lane built again), in ``folder``."""
    digest = hashlib.sha256()
    core = folder.parent.parent.parent / "core"
    for source in sorted([*folder.glob("_lane*.pyx"), *folder.glob("_lane*.pxi")]) + sorted(core.glob("*.pxd")):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]
