"""Types of the native lane (``_lane.pyx``, built by hatch_build.py) as the router's Python sees them."""
import asyncio
from typing import Any, Protocol

SOURCE_HASH: str
HANDOVER_REASONS: tuple[str, ...]
RELAY: str


BOUNDS: dict[str, int]


class Glue(Protocol):
    """What the lane calls in the router (``glue.LaneGlue``), and what its sticky hit reads of it."""

    context: Any
    paths: dict[bytes, int]
    pools: dict[str, Any]

    def pool(self, replica: str) -> Any: ...
    def route(self, client: Any, path: bytes, size: int, key_at: int, key: bytes | None, group_at: int,
              group: bytes | None, now: float) -> Any: ...
    def finish(self, token: Any, code: int | None, status: int, failure: str | None, first_at: float,
               tail: bytes | None, now: float) -> None: ...
    def abandon(self, token: Any, error: OSError) -> None: ...
    def failed(self, replica: str, state: int, what: str, timed_out: bool, sse_chunked: bool
               ) -> tuple[bytes | None, int]: ...
    def head(self, replica: str, status: int, reason: bytes, headers: list[tuple[bytes, bytes]], has_length: bool,
             keeps: bool, version: str | None) -> tuple[bytes, bytes, bool, bool, bool, bool]: ...
    def connect(self, pool: Any, client: Any) -> None: ...
    def opened(self, client: Any) -> bool: ...
    def closed(self, client: Any) -> None: ...
    def exception(self, error: BaseException) -> None: ...
    def hand_over(self, native: Any, data: bytes, why: int, handed: Any) -> Any: ...


class Lane:
    now: float
    idle_seconds: float
    write_stall_seconds: float
    write_high_water: int
    max_body: int
    max_buffered: int
    forwarded: int
    closing: bool
    sticky: Sticky | None

    def __init__(self, glue: Glue, listener: Any, active: set[Any], versions: dict[str, str]) -> None: ...
    def set_names(self, session: tuple[bytes, ...], group: tuple[bytes, ...]) -> bool: ...
    def route(self, client: Any, path: bytes, size: int, key_at: int, key: bytes | None, group_at: int,
              group: bytes | None, now: float) -> Any: ...
    def finish(self, token: Any, code: int | None, status: int, failure: str | None, first_at: float,
               tail: bytes | None, now: float) -> None: ...
    def handover_counts(self) -> dict[str, int]: ...


class Sticky:
    hits: int
    answers: int
    answering: int

    def __init__(self, glue: Glue, parts: tuple[Any, ...]) -> None: ...
    def sync(self, settings: Any, max_key: int, group_fields: bool) -> None: ...


class Pool:
    replica: str
    prefix: bytes
    host_header: bytes
    host: str
    port: int
    ssl: Any

    def __init__(self, replica: str, prefix: bytes, host_header: bytes, host: str, port: int, ssl: Any) -> None: ...
    def __len__(self) -> int: ...
    def close_idle(self, older_than: float) -> None: ...


class Client(asyncio.Protocol):  # an asyncio Protocol to uvloop, which calls its methods (no subclass)
    transport: Any
    gone: bool
    write_paused: bool
    shaped: int
    since: float
    body_since: float

    def __init__(self, lane: Lane) -> None: ...
    def adopt(self, transport: Any, active_at: float) -> None: ...
    def connected(self, upstream: Upstream) -> None: ...
    def refused(self, error: OSError) -> None: ...
    def check(self, now: float, limits: Any) -> None: ...
    def abort(self) -> None: ...
    def close_if_idle(self, idle_before: float) -> None: ...


class Upstream(asyncio.Protocol):  # as Client
    transport: Any
    closed: bool
    idle_since: float
    seen: int
    swept: int
    silent: float
    @property
    def state(self) -> int: ...
    @property
    def paused(self) -> bool: ...
    @property
    def forwarded(self) -> bool: ...

    def __init__(self, pool: Pool, lane: Lane) -> None: ...
    def timeout(self) -> None: ...
