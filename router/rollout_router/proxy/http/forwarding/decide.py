"""Route or decline: what happens to a request before anything is sent, written once for the traffic port's two
paths that answer without a Task, the Python fast path (``HttpProxy._fast``) and the native lane's glue
(``LaneGlue.route``). The coroutine path (``HttpProxy.handle``) routes through the same ``attempts.taken`` but
may wait first (the RL pause, a hop, a pin to fetch), which these two decline to do.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...attempts import taken

if TYPE_CHECKING:
    from ...context import RouterContext
    from ...outcome import Routing
    from .delegated import Asked
    from .port import TrafficPort


def open_now(context: RouterContext) -> bool:
    """Nothing that needs a wait: dispatch is not paused (``/v1/rl/pause``) and this router is not leaving its
    fleet (its keys' new owners decide them, which the coroutine path asks)."""
    fleet = context.fleet
    return not context.rl.paused and not (fleet is not None and fleet.leaving)


def route_or_decline(proxy: TrafficPort, key: str | None, group: str | None, hopped: bool,
                     asker: Callable[[], Asked], started: float = 0.0) -> Routing | bool:
    """Route a request here (its replica counted in flight, ``proxy.answering_here`` counting it); or, for a key
    a sibling worker decides, ask that worker with ``asker()`` (True: its answer finishes the request); or
    decline (False: the coroutine path answers it, relaying through the key's owner router or fetching its pin
    first). Raises what routing raises (``NoReplicaError``), for the caller to decline on."""
    context = proxy.context
    fleet = context.fleet
    if fleet is not None and key is not None and not fleet.decided_here(key, hopped):
        return not hopped and _asked(proxy, key, group, asker)
    routing = taken(context, key, None, False, group, started)
    proxy.answering_here += 1
    return routing


def _asked(proxy: TrafficPort, key: str, group: str | None, asker: Callable[[], Asked]) -> bool:
    """Ask the sibling worker that owns ``key``; False when there is none to ask (another router owns it, or no
    channel is open)."""
    fleet, decisions = proxy.context.fleet, proxy.decisions
    if decisions is None or fleet is None or (owner := fleet.owner_of(key)) is None:
        return False
    if not asker().ask(decisions, owner.id, key, group):
        return False
    proxy.answering_here += 1
    return True
