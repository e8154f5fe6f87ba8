"""The bearer token that guards the routes which change routing (worker API, session release).

The token is a file's content (a mounted Secret, say), re-read whenever the
file changes, so a rotated Secret applies without a restart. Any listener
can use it: ``TokenFile.allows`` takes the raw ``Authorization`` header value.
"""
from __future__ import annotations

import hmac
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


class TokenFile:
    """A bearer token read from a file, re-read whenever the file changes (a mounted Secret is swapped whole)."""

    def __init__(self, path: Path):
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._token = self._read()  # a token file missing or empty at start is an error at start

    def _read(self) -> bytes:
        stat = self.path.stat()
        token = self.path.read_bytes().strip()
        if not token:
            raise ValueError(f"admin token file {self.path} is empty")
        self._stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        return token

    def current(self) -> bytes:
        """The token now; an unreadable or empty new version is logged and the last good one kept."""
        try:
            stat = os.stat(self.path)
            if (stat.st_ino, stat.st_mtime_ns, stat.st_size) != self._stamp:
                self._token = self._read()
                log.info("admin token file %s re-read", self.path)
        except (OSError, ValueError) as error:
            log.error("admin token file %s unreadable, keeping the previous token: %s", self.path, error)
        return self._token

    def allows(self, authorization: bytes | None) -> bool:
        """Whether an ``Authorization`` header value carries the token (compared in constant time)."""
        scheme, _, credentials = (authorization or b"").strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self.current())
