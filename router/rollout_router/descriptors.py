"""File descriptors are the router's own resource: raise the limit at start, keep clients from using them all,
and never blame a replica for the router's own shortage.

With the soft ``RLIMIT_NOFILE`` of many systems (1,024) and ``maxConnections`` 10,000, about a thousand idle
clients used to exhaust the router's descriptors; the next connect to a replica, or probe of one, failed with
EMFILE and the replica was marked down, so every replica went out of rotation while they were all fine. Now:

- ``raise_limit`` lifts the soft limit to the hard limit at start (an unprivileged process may).
- ``connection_cap`` is what each traffic listener may hold: ``maxConnections``, cut so that all listeners'
  clients together leave ``RESERVE`` descriptors for replica connections, probes, the admin listener, peers
  and files; ``say_cut`` logs a cut once, after the listeners are bound (a bind error stays one line).
- ``local_shortage`` tells an EMFILE/ENFILE apart from a replica's failure: the callers then answer 503 (or
  leave the probe's verdict as it was) and ``report`` counts it, logging once per episode.
"""
from __future__ import annotations

import errno
import logging
import resource
import time

log = logging.getLogger(__name__)

RESERVE = 512  # descriptors kept free of clients: replica connections, probes, admin, peers, files
CEILING = 1 << 20  # what "unlimited" is raised to: the kernel's default nr_open
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
EPISODE_SECONDS = 10.0  # a shortage reported within this long of the last one is the same episode

exhausted: dict[str, int] = {}  # where -> how often (connect, probe, accept), read by the metrics collector
_last_report = [float("-inf")]


def raise_limit() -> int:
    """Lift the soft RLIMIT_NOFILE to the hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = CEILING if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return CEILING if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as error:  # a container may refuse even what getrlimit reported
        log.warning("could not raise the file descriptor limit from %d to %d: %s", soft, wanted, error)
        return soft
    return wanted


def connection_cap(configured: int, limit: int, listeners: int) -> int:
    """Clients one traffic listener may hold so that ``listeners`` of them leave ``RESERVE`` descriptors."""
    return min(configured, max(1, (limit - RESERVE) // max(1, listeners)))


def say_cut(configured: int, cap: int, limit: int) -> None:
    """Log, once, that ``maxConnections`` was cut to ``cap`` (nothing when it was not)."""
    if cap < configured:
        log.warning("maxConnections %d per listener cut to %d: the file descriptor limit is %d (hard limit; "
                    "raise it, e.g. ulimit -n, to allow more) and %d are kept for replicas, probes and admin",
                    configured, cap, limit, RESERVE)


def local_shortage(error: OSError) -> bool:
    """Whether a failed connect is the router's own shortage of descriptors, not the other side's failure."""
    return error.errno in LOCAL_ERRNOS


def report(where: str, now: float | None = None) -> None:
    """Count one shortage; log the first of an episode (a burst of thousands would flood the log)."""
    exhausted[where] = exhausted.get(where, 0) + 1
    now = time.monotonic() if now is None else now
    if now - _last_report[0] > EPISODE_SECONDS:
        log.error("the router ran out of file descriptors (%s): requests get 503 and no replica is blamed; "
                  "raise the limit (ulimit -n) or lower maxConnections", where)
    _last_report[0] = now
