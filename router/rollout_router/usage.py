"""Command-line mistakes as one line and exit 2: argparse types that check ranges, and ``UsageError``.

A subcommand raises ``UsageError`` (the message names the flag the user wrote and the value) wherever it
finds the problem, also deep inside a running event loop (a port that cannot be bound); ``cli.main`` prints
``rollout-router COMMAND: MESSAGE`` and exits 2. Range checks belong in the flag's argparse type, so argparse
itself names the flag, and the value is checked before anything starts.
"""
from __future__ import annotations

import argparse
import errno
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class UsageError(Exception):
    """A mistake of the user's: one line naming the flag (or file key) and the value; exit 2."""


def port(text: str) -> int:
    """A TCP port, 1-65535."""
    return _port(text, zero=False)


def port_or_zero(text: str) -> int:
    """A TCP port, 1-65535, or 0: the kernel picks a free one."""
    return _port(text, zero=True)


def _port(text: str, zero: bool) -> int:
    low = 0 if zero else 1
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not low <= value <= 65535:
        raise argparse.ArgumentTypeError(
            f"must be a port {low}-65535{' (0 picks a free one)' if zero else ''}, got {text!r}")
    return value


def at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low`` (and <= ``high``, if given)."""
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be an integer <= {high}, got {text!r}")
        return value
    check.__name__ = f"integer >= {low}"
    return check


def number(positive: bool) -> Callable[[str], float]:
    """An argparse type: a finite number > 0 (``positive``) or >= 0."""
    def check(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (0 < value if positive else 0 <= value) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a number {'> 0' if positive else '>= 0'}, got {text!r}")
        return value
    check.__name__ = "positive number" if positive else "number >= 0"
    return check


def margin(text: str) -> float | None:
    """An argparse type: an affinity break margin, a number >= 0 (2 or 2.5, as verl takes it) or null; a whole
    number stays an int, so it prints as the user wrote it."""
    if text.lower() in ("null", "none"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0 or 'null', got {text!r}")
    return int(value) if value.is_integer() else value


def margins(text: str) -> tuple[float, ...]:
    """An argparse type: comma-separated margins >= 0 (each as ``margin`` takes it, null excepted: a sticky arm
    always runs), in the order given, each once."""
    found: list[float] = []
    for part in text.split(","):
        value = margin(part.strip())
        if value is None:
            raise argparse.ArgumentTypeError(f"null is the sticky arm, which always runs; got {text!r}")
        if value not in found:
            found.append(value)
    return tuple(found)


def new_file(text: str) -> Path:
    """An argparse type: a file to be written, in a directory that exists (checked before anything starts)."""
    path = Path(text)
    if not text or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a file" if text else "must name a file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: directory {str(path.parent)!r} does not exist")
    return path


def output_file(text: str) -> str:
    """An argparse type: a file to be written, its directories made if need be; not one that is a directory (found
    before a long run, not after it)."""
    if not text or Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a file" if text else "must name a file")
    return text


def existing_file(text: str) -> str:
    """An argparse type: a file that exists (checked before a long run, not after it)."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return text


def host(text: str) -> str:
    """An argparse type: an address or host name to listen on; an empty one would mean every address."""
    if not text.strip() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"must be an address or a host name (0.0.0.0 or :: for every address), "
                                         f"got {text!r}")
    return text


def reading(flag: str, path: str | Path) -> str:
    """The text of the file a flag names; a missing or unreadable one is a ``UsageError`` naming the flag."""
    try:
        return Path(path).read_text()
    except OSError as error:
        raise UsageError(f"{flag} {path}: {error.strerror}") from None


BIND_REASONS = {
    errno.EADDRINUSE: ("port", "already in use (another process listens there; pick another port, or 0 for any)"),
    errno.EACCES: ("port", "permission denied (ports below 1024 need privileges; pick one above 1023)"),
    errno.EADDRNOTAVAIL: ("host", "is not an address of this machine"),
}


async def bind(start: Awaitable[T], host_flag: str, port_flag: str, host: str, port: int) -> T:
    """Await ``start`` (a listener binding ``host:port``); a refusal becomes a ``UsageError`` naming the flag."""
    try:
        return await start
    except socket.gaierror as error:
        raise UsageError(f"{host_flag} {host}: not a host name or address of this machine ({error.strerror})") \
            from None
    except OSError as error:
        which, reason = BIND_REASONS.get(error.errno or 0, ("port", error.strerror or str(error)))
        if which == "host":
            raise UsageError(f"{host_flag} {host}: {reason}") from None
        raise UsageError(f"{port_flag} {port}: cannot listen on {host}:{port}: {reason}") from None
