"""Jittered exponential backoff for loops that must keep trying (a router must never stay blind)."""
from __future__ import annotations

import asyncio
import logging
import random

BACKOFF_MIN, BACKOFF_MAX = 0.5, 30.0


class Backoff:
    """``await backoff.wait(problem)`` after a failure, ``reset()`` after a success."""

    def __init__(self, log: logging.Logger, first: float = BACKOFF_MIN, cap: float = BACKOFF_MAX):
        self.log, self.first, self.cap = log, first, cap
        self.delay = first

    def reset(self) -> None:
        self.delay = self.first

    async def wait(self, problem: str) -> None:
        self.log.warning("%s; retrying in %.1fs", problem, self.delay)
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2 * random.uniform(0.8, 1.2), self.cap)  # capped after the jitter
