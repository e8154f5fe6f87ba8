"""Pins that survive a restart (``serve --state-file PATH``): written as the router stops, read back as it starts.

Without it a restarted router places every session anew: each session's next turn lands on a replica without its
prefix, and is counted as new. The file is JSON::

    {"format": "rollout-router/pins/1", "savedAt": UNIX_TIME,
     "pins": [[KEY, REPLICA, LAST_USE_UNIX_TIME], ...],   (least recently used first)
     "groups": [[GROUP, REPLICA], ...]}                   (GRPO groups' replicas, least recently placed first)

It is written atomically (a temporary file beside it, then renamed), so a router killed while writing leaves the
previous file whole. It is read back bounded and checked: at most ``MAX_BYTES``, then the session table's own
bounds (``maxSessions``, ``maxGroups``: the most recently used are kept); a pin to a replica this router does not
have, one idle past ``idleTimeoutSeconds`` counting the time stopped, or one that is malformed is dropped; a file
that is not of this format (corrupt, truncated, another program's) is one log line and an empty table.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path

from .balancer import Balancer
from .replicas import ReplicaSet
from .settings import SessionSettings

log = logging.getLogger(__name__)

FORMAT = "rollout-router/pins/1"
MAX_BYTES = 256 * 1024 * 1024  # a file larger than this is not read (about two million pins)


def save(path: Path, balancer: Balancer, clock_now: float) -> int:
    """Write every pin and group placement to ``path`` atomically; returns how many pins. ``clock_now``: the
    balancer's clock now (its pins' last uses are on it), turned into Unix time for the next process."""
    offset = time.time() - clock_now
    pins = [[key, replica, round(used + offset, 3)] for key, replica, used in balancer.pins()]
    document = {"format": FORMAT, "savedAt": round(time.time(), 3), "pins": pins,
                "groups": [list(placement) for placement in balancer.policy.placements()]}
    folder = path.parent
    with tempfile.NamedTemporaryFile("w", dir=folder, prefix=f".{path.name}.", delete=False) as out:
        try:
            json.dump(document, out, separators=(",", ":"))
            out.flush()
            os.fsync(out.fileno())
        except BaseException:
            os.unlink(out.name)
            raise
    os.replace(out.name, path)
    return len(pins)


def save_logged(path: Path, balancer: Balancer, clock_now: float) -> None:
    """``save``, saying how many pins were written, or why none were (the router stops either way)."""
    try:
        saved = save(path, balancer, clock_now)
    except OSError as error:
        log.error("--state-file %s not written, the pins are lost: %s", path, error.strerror or error)
        return
    log.info("--state-file %s: %d pins written", path, saved)


def restore(path: Path, balancer: Balancer, replicas: ReplicaSet, session: SessionSettings) -> tuple[int, int]:
    """Read ``path`` back into ``balancer``: (pins restored, pins dropped). A missing file is no pins; a file
    that cannot be read as this format is one warning, and no pins."""
    try:
        document = _read(path)
    except FileNotFoundError:
        return 0, 0
    except (OSError, ValueError) as error:
        log.warning("--state-file %s not read, starting with no pins: %s", path, error)
        return 0, 0
    pins, groups = document["pins"], document["groups"]
    now = time.time()
    kept = [pin for pin in pins[-session.max_sessions:] if _usable(pin, now, replicas, session)]
    for key, replica, used in kept:
        balancer.adopt(key, replica, max(0.0, now - used))
    for group in groups:
        if _placement(group, replicas):
            balancer.policy.place_group(*group)
    balancer.policy.counters.restored += len(kept)
    log.info("--state-file %s: %d pins restored, %d dropped (replica unknown, idle past the timeout, or malformed)",
             path, len(kept), len(pins) - len(kept))
    return len(kept), len(pins) - len(kept)


def _read(path: Path) -> dict:
    with path.open("rb") as file:
        data = file.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES} bytes")
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"not a pins file of this router (no \"format\": \"{FORMAT}\")")
    if not isinstance(document.get("pins"), list) or not isinstance(document.get("groups", []), list):
        raise ValueError("\"pins\" and \"groups\" must be lists")
    return {"pins": document["pins"], "groups": document.get("groups", [])}


def _usable(pin: object, now: float, replicas: ReplicaSet, session: SessionSettings) -> bool:
    """A well-formed pin to a replica of this router, not idle past the timeout."""
    if not (isinstance(pin, list) and len(pin) == 3):
        return False
    key, replica, used = pin
    if not (isinstance(key, str) and 0 < len(key.encode("utf-8", "surrogatepass")) <= session.max_key_bytes
            and isinstance(replica, str) and replica in replicas):
        return False
    if isinstance(used, bool) or not isinstance(used, int | float) or not used == used:  # NaN is not a time
        return False
    ttl = session.idle_timeout_seconds
    return ttl is None or now - used <= ttl


def _placement(group: object, replicas: ReplicaSet) -> bool:
    return (isinstance(group, list) and len(group) == 2 and isinstance(group[0], str) and 0 < len(group[0]) <= 65536
            and isinstance(group[1], str) and group[1] in replicas)
