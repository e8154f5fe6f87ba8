"""Pins that survive a restart (``serve --state-file PATH``): written as the router stops, read back as it starts.

Without it a restarted router places every session anew: each session's next turn lands on a replica without its
prefix, and is counted as new. The file is JSON::

    {"format": "rollout-router/pins/1", "savedAt": UNIX_TIME,
     "pins": [[KEY, REPLICA, LAST_USE_UNIX_TIME], ...],   (least recently used first)
     "groups": [[GROUP, REPLICA], ...]}                   (GRPO groups' replicas, least recently placed first)

It is written atomically (a temporary file beside it, then renamed), so a router killed while writing leaves the
previous file whole. It is read back bounded and checked: at most ``MAX_BYTES``, then the session table's own
bounds (``maxSessions``, ``maxGroups``: the most recently used are kept; the file's size at most what that many
pins take); a pin to a replica this router does not have, one idle past ``idleTimeoutSeconds`` counting the time
stopped, one repeated (the last kept) or one that is malformed is dropped; a file that is not of this format
(corrupt, truncated, another program's) is one log line and an empty table.
"""
from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from pathlib import Path

from .balancer import Balancer
from .replicas import ReplicaSet
from .settings import SessionSettings

log = logging.getLogger(__name__)

FORMAT = "rollout-router/pins/1"
MAX_BYTES = 256 * 1024 * 1024  # a file larger than this is never read
# below that, at most what maxSessions pins take: a key, a replica URL, a time and the JSON around them each
BYTES_PER_PIN, BYTES_SLACK = 2048 + 64, 16 * 1024 * 1024  # (the groups: a replica URL is at most 2,048 characters)
CLOCK_SLACK = 60.0  # a last use this far in the future is a clock gone wrong (or a forged file): dropped


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
    _sync_folder(folder)
    return len(pins)


def _sync_folder(folder: Path) -> None:
    """The rename itself on disk (a crash right after keeps the new file, not an empty name)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def save_logged(path: Path, balancer: Balancer, clock_now: float) -> None:
    """``save``, saying how many pins were written, or why none were (the router stops either way)."""
    try:
        saved = save(path, balancer, clock_now)
    except OSError as error:
        log.error("--state-file %s not written, the pins are lost: %s", path, error.strerror or error)
        return
    log.info("--state-file %s: %d pins written", path, saved)


def restore(path: Path, balancer: Balancer, replicas: ReplicaSet, session: SessionSettings,
            max_groups: int) -> tuple[int, int]:
    """Read ``path`` back into ``balancer``: (pins restored, pins dropped). A missing file is no pins; a file
    that cannot be read as this format is one warning, and no pins."""
    try:
        document = _read(path, session)
    except FileNotFoundError:
        return 0, 0
    except (OSError, ValueError) as error:
        log.warning("--state-file %s not read, starting with no pins: %s", path, error)
        return 0, 0
    pins, groups = document["pins"], document["groups"]
    now = time.time()
    usable = {pin[0]: pin for pin in (_usable(pin, now, replicas, session) for pin in pins) if pin is not None}
    kept = sorted(usable.values(), key=lambda pin: pin[2])[-session.max_sessions:]  # least recently used first
    before = balancer.policy.sessions()
    for key, replica, used in kept:
        balancer.adopt(key, replica, now - used)
    for group in groups[-max_groups:]:
        if _placement(group, replicas):
            balancer.policy.place_group(*group)
    restored = balancer.policy.sessions() - before  # (a policy that keeps no pins takes none)
    balancer.policy.counters.restored += restored
    log.info("--state-file %s: %d pins restored, %d dropped (replica unknown, idle past the timeout, repeated, or "
             "malformed)", path, restored, len(pins) - restored)
    return restored, len(pins) - restored


def _read(path: Path, session: SessionSettings) -> dict:
    limit = min(MAX_BYTES, session.max_sessions * (session.max_key_bytes + BYTES_PER_PIN) + BYTES_SLACK)
    with path.open("rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes, more than session.maxSessions pins could take")
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"not a pins file of this router (no \"format\": \"{FORMAT}\")")
    if not isinstance(document.get("pins"), list) or not isinstance(document.get("groups", []), list):
        raise ValueError("\"pins\" and \"groups\" must be lists")
    return {"pins": document["pins"], "groups": document.get("groups", [])}


def _usable(pin: object, now: float, replicas: ReplicaSet, session: SessionSettings) -> tuple[str, str, float] | None:
    """A well-formed pin to a replica of this router, not idle past the timeout, as (key, replica, last use)."""
    if not (isinstance(pin, list) and len(pin) == 3):
        return None
    key, replica, used = pin
    if not (isinstance(key, str) and 0 < len(key.encode("utf-8", "surrogatepass")) <= session.max_key_bytes
            and isinstance(replica, str) and replica in replicas):
        return None
    if isinstance(used, bool) or not isinstance(used, int | float):
        return None
    try:
        used = float(used)  # a huge integer is no time (OverflowError)
    except OverflowError:
        return None
    if not math.isfinite(used) or used > now + CLOCK_SLACK:
        return None
    ttl = session.idle_timeout_seconds
    return (key, replica, used) if ttl is None or now - used <= ttl else None


def _placement(group: object, replicas: ReplicaSet) -> bool:
    return (isinstance(group, list) and len(group) == 2 and isinstance(group[0], str) and 0 < len(group[0]) <= 65536
            and isinstance(group[1], str) and group[1] in replicas)
