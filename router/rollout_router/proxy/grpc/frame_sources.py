"""The hash of the compiled frame engine's sources (``_grpc_frames.pyx`` and its ``.pxd``): what the built module
records (``hatch_build.py`` loads this file by its path at install, before the package's dependencies are there:
the standard library only) and what ``h2`` checks, so a router never runs an engine older than its sources."""
from __future__ import annotations

import hashlib
from pathlib import Path

FOLDER = Path(__file__).parent
SOURCES = ("_grpc_frames.pyx", "_grpc_frames.pxd")


def source_hash(folder: Path = FOLDER) -> str | None:
    """The hash of the engine's sources in ``folder``; None where they are not (an installed wheel)."""
    digest = hashlib.sha256()
    for name in SOURCES:
        path = folder / name
        if not path.exists():
            return None
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
