"""Fixtures shared by the test modules."""
from __future__ import annotations

import aiohttp
import pytest


@pytest.fixture
async def http():
    """A client session for talking to routers and replicas over real sockets."""
    async with aiohttp.ClientSession() as session:
        yield session
