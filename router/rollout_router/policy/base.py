"""The one interface every routing policy implements.

A policy is pure: it sees replica loads and a session key handed to it, and
answers with a replica. It performs no I/O, reads no clock (the caller passes
``now``) and never touches asyncio, so the proxy, the fleet simulator and the
tests all drive the very same code.
"""
from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from ..core.counters import DecisionCounts


class NoReplicaError(LookupError):
    """Raised when a request must be routed but no replica can take it."""


class Outcome(enum.StrEnum):
    """Why a replica was chosen; every decision has exactly one outcome."""

    NEW = "new"  # first request of a session: pinned to a least-loaded replica
    KEPT = "kept"  # sticky hit, affinity kept
    BROKEN = "broken"  # sticky hit, skew beyond the margin: re-pinned
    REPINNED = "repinned"  # the pinned replica left the set: re-pinned
    UNKEYED = "unkeyed"  # no session key: least-loaded, nothing pinned


@dataclasses.dataclass(slots=True)
class Request:
    """What a policy may look at for one routing decision (a policy reads it and never changes it).

    ``loads`` maps every routable replica to its load *before* this request is
    added (in-flight requests for the router; the simulator may pass another
    measure). ``prefix`` is optional request content (token ids or text) for
    cache-aware policies; affinity policies ignore it. ``group`` places a new
    session beside its siblings (``groups``); only the affinity policies read it.
    """

    key: str | None
    loads: Mapping[str, float]
    now: float = 0.0
    prefix: Sequence[int] | str | None = None
    group: str | None = None  # the GRPO group (the prompt) a new session belongs to: policy/groups.py
    # Not frozen: one is built per routed request, and a frozen dataclass's __init__ (object.__setattr__ per
    # field) costs about four times a plain one's (issue 22).


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    replica: str
    outcome: Outcome
    previous: str | None = None  # the replica a BROKEN/REPINNED session left
    pin_age: float | None = None  # BROKEN: how long the session had been on ``previous`` (seconds)


class Counters(DecisionCounts):
    """Monotonic decision counters (``core.counters``), exported as metrics and in /status, counted by outcome."""

    __slots__ = ()

    def count(self, outcome: Outcome) -> None:
        field = _OUTCOME_FIELD[outcome]
        setattr(self, field, getattr(self, field) + 1)

    def by_outcome(self) -> dict[str, int]:
        """Decisions per ``Outcome`` value."""
        return {outcome.value: getattr(self, field) for outcome, field in _OUTCOME_FIELD.items()}


_OUTCOME_FIELD = {
    Outcome.NEW: "new_sessions",
    Outcome.KEPT: "affinity_kept",
    Outcome.BROKEN: "affinity_broken",
    Outcome.REPINNED: "repinned_replica_gone",
    Outcome.UNKEYED: "unkeyed",
}


class PolicyOptions(BaseModel):
    """A policy's own knobs, typed: the policy declares the model (``Policy.Options``), the router's settings
    hold it under the policy's name (camelCase on the wire, like every setting) and hand it over in
    ``LiveConfig.options``."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


OptionsT = TypeVar("OptionsT", bound=PolicyOptions)


@dataclasses.dataclass(frozen=True, slots=True)
class LiveConfig:
    """The router-level knobs a running policy takes without losing its pins.

    The router builds this from its settings on start and on every reload and
    hands it to ``Policy.configure``; each policy applies the fields that mean
    something to it and ignores the rest (a stateless policy ignores all).
    ``options`` are the running policy's own (its ``Options`` model); None
    gives it that model's defaults.
    """

    margin: float | None = None
    full_determinism: bool = False
    max_sessions: int = 100_000
    idle_ttl: float | None = 3600.0
    options: PolicyOptions | None = None
    max_groups: int = 10_000

    def options_for(self, model: type[OptionsT]) -> OptionsT:
        """``options`` as ``model`` (its defaults when None); options of another policy are an error."""
        if self.options is None:
            return model()
        if not isinstance(self.options, model):
            raise TypeError(f"{type(self.options).__name__} given where {model.__name__} is wanted")
        return self.options


class Policy(abc.ABC):
    """A routing policy: ``route`` decides; the optional hooks default to a stateless policy.

    What the decision counters mean is the same under every policy that tracks
    sessions: ``affinity_kept`` is a keyed turn sent to the replica its previous
    turn went to, ``affinity_broken`` one sent elsewhere while that replica was
    still routable, ``repinned_replica_gone`` one sent elsewhere because it was
    not, ``new_sessions`` a key seen for the first time. Stateless policies
    (least_loaded, round_robin, power_of_two) remember no key: they count every
    request as ``unkeyed``.

    A request the chosen replica did not accept (an error status, or no answer
    at all) leaves the session table as it was before the request: the caller
    hands the decision back to ``forget``. A new session gets no pin (a bad
    first request does not tie a conversation to a replica); a moved session
    (broken, re-pinned) goes back to the replica of its previous turn; a kept
    one is unchanged. Counters are not rolled back: they count decisions.
    """

    name: ClassVar[str]
    Options: ClassVar[type[PolicyOptions] | None] = None  # the policy's own live knobs, if it has any

    def __init__(self) -> None:
        self.counters = Counters()

    @abc.abstractmethod
    def route(self, request: Request) -> Decision: ...

    def decide(self, key: str | None, loads: Mapping[str, float], now: float,
               prefix: Sequence[int] | str | None = None, group: str | None = None) -> Decision:
        """``route`` of the ``Request`` these make, as the router calls it once per request. A policy on the
        router's hot path overrides this and builds ``route`` on it (no ``Request`` is made per request);
        the others need only ``route``."""
        return self.route(Request(key, loads, now, prefix, group))

    def configure(self, config: LiveConfig) -> None:
        """Apply the router's live knobs; pins and counters are kept."""

    def release(self, key: str) -> bool:
        """Drop ``key``'s pin now; False if it had none."""
        return False

    def forget(self, key: str, decision: Decision, now: float) -> None:
        """Undo what ``decision`` did to ``key``'s pin: its replica did not accept the request."""

    def sessions(self) -> int:
        """Pins currently held."""
        return 0

    def pinned(self, key: str, now: float) -> str | None:
        """The replica ``key`` is pinned to, if any."""
        return None

    def adopt(self, key: str, replica: str, now: float) -> None:
        """Take over a pin another router held (ownership moved); nothing is counted."""

    def last_used(self, key: str, now: float) -> float | None:
        """When ``key``'s pin was last used, if it has one (a pushed pin older than it does not replace it)."""
        return None

    def pin_age(self, key: str, now: float) -> float | None:
        """How long ``key`` has been pinned to its replica, if it has a pin (the age of a pin a break ends)."""
        return None

    def pins(self, now: float) -> list[tuple[str, str, float]]:
        """Every pin held, as (key, replica, last use): what a router leaving the fleet hands over."""
        return []

    def surrender(self, key: str, now: float) -> str | None:
        """Give up ``key``'s pin to the router that owns it now; the replica it was pinned to, if any."""
        return None

    def placements(self) -> list[tuple[str, str]]:
        """Every GRPO group's replica (policy/groups.py), least recently placed first: what a stopping router saves."""
        return []

    def place_group(self, group: str, replica: str) -> None:
        """Take back ``group``'s replica, as saved by a router that stopped (placed most recently)."""

    def expire(self, now: float, limit: int | None = None) -> int:
        """Drop pins idle past their TTL, at most ``limit`` (None: all); returns how many."""
        return 0

    def release_all(self) -> int:
        """Drop every pin (a phase switch in an RL job); returns how many."""
        return 0
