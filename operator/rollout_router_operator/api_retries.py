"""One log line per backoff step while the Kubernetes API cannot be reached, instead of kopf's.

kopf logs every failed attempt of every API call on its own, each with the full repr of the aiohttp error
(two long lines per attempt at start-up: ``/api`` and ``/apis``). This filter rewrites such a record into
one line naming the API server, the reason and when the next try comes, and drops the copies of the same
attempt made by the calls running beside it.
"""
from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

RETRY = re.compile(r"Request attempt #?(\d+) failed; will retry: \S+ (\S+) -> (.*)", re.S)
REASONS = {"ConnectionRefusedError": "connection refused", "TimeoutError": "timed out",
           "gaierror": "host name not found", "ServerDisconnectedError": "server disconnected"}


class OneLinePerRetry(logging.Filter):
    """Rewrites kopf's "will retry" records; ``backoffs`` are the delays kopf sleeps between attempts."""

    def __init__(self, backoffs: Iterable[float]):
        super().__init__()
        self._delays = list(itertools.islice(backoffs, 100))
        self._last: tuple[str, str] | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        match = RETRY.match(record.getMessage())
        if match is None:
            return True
        attempt, url, error = match.groups()
        parts = urlsplit(url)
        server = f"{parts.scheme}://{parts.netloc}"
        if (attempt, server) == self._last:
            return False  # the same attempt of another call beside it
        self._last = (attempt, server)
        delay = self._delays[min(int(attempt), len(self._delays)) - 1]
        record.msg, record.args = (f"Kubernetes API {server} unreachable ({reason(error)}): attempt {attempt} "
                                   f"failed, next try in {delay:g} s"), ()
        return True


def reason(error: str) -> str:
    """A few words for an aiohttp / kopf error repr: the innermost error's name, in words where known."""
    names = re.findall(r"\b(\w+(?:Error|Exception|gaierror))\(", error)
    name = names[-1] if names else error.split("(", 1)[0]
    return REASONS.get(name, name)
