"""One router's part in a fleet: its members, who owns a key, the shared loads, handoffs and counters.

``Fleet`` watches every candidate peer's ``/fleet/v1/loads`` (a line when its
loads change, looked at each ``pollIntervalSeconds``, and a heartbeat): a line
keeps the peer a member (and carries its in-flight counts for the ``peers``
load view), silence for ``peerTimeoutSeconds`` ends its membership. Each change of the member set is
recorded in the ownership history and clears the owner cache, so the data
path's ``owner_of`` is a dict lookup for a key seen since the last change.
A peer that says it is leaving (its loads answer, or ``peer_leaving``) stops
owning keys at once; this router's own leave is ``fleet/leaving.py``.

Ownership is ``rendezvous`` (the hash's winner owns a key; the others forward
to it) or ``entry`` (the router a turn enters by owns its session and pulls
the pin from its peers when it has none: ``Handoff.lookup``; it forwards only
while it leaves the fleet).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from ..listening import address, any_address
from ..settings import FleetSettings, Ownership
from . import loadview
from .client import PeerClient, PeerError, Unreachable
from .handoff import Handoff
from .membership import PODS, STATIC, Member, Membership
from .ownership import History, owner

if TYPE_CHECKING:
    from ..balancer import Balancer
    from ..replicas import ReplicaSet
    from .rlstate import RlState

log = logging.getLogger(__name__)

OWNER_CACHE = 100_000  # keys whose owner is remembered between member changes
DEFAULT_WINDOW = 3600.0  # how long a previous member set is asked for pins when sessions never expire
MAX_PEER_LOAD = 1 << 31  # a peer's count of requests in flight on one replica is clamped to this


def advertised(admin_host: str, admin_port: int) -> str:
    """The default member id: the admin listener's URL, with an any-address replaced by ``$POD_IP`` (in brackets
    when it is IPv6, as peers find it from the pod's status: ``peerpods.admin_urls``)."""
    host = admin_host
    if any_address(host) and os.environ.get("POD_IP"):
        host = os.environ["POD_IP"]
    return f"http://{address(host, admin_port)}"


class Fleet:
    """Given what it reads: the replica set (the peers' loads go into it), the balancer (pins move), the clock,
    the fleet settings it starts with and the session idle timeout (live: how long old member sets are asked)."""

    def __init__(self, replicas: ReplicaSet, balancer: Balancer, clock: Callable[[], float],
                 settings: FleetSettings, idle_timeout: Callable[[], float | None], self_id: str, http_url: str,
                 grpc_target: str | None, token: Callable[[], bytes | None], cli_peers: Sequence[str] = (),
                 peer_selector: str | None = None, peer_namespace: str | None = None,
                 ownership: Ownership | None = None, rl: RlState | None = None, siblings: Sequence[str] = ()):
        self.replicas, self.balancer, self.clock, self._idle_timeout = replicas, balancer, clock, idle_timeout
        self.self_id = self_id.rstrip("/")
        self.http_url, self.grpc_target = http_url, grpc_target
        self._cli_peers, self._selector, self._namespace = list(cli_peers), peer_selector, peer_namespace
        self._cli_ownership = ownership  # --ownership: wins over fleet.ownership
        self.rl = rl  # the RL pause state: a peer's newer one (in its loads answer) is adopted
        self.settings = settings
        # A --workers N worker: the other workers of its pod. Seen before /readyz says ready (``quorate``); never
        # handed pins when leaving, since they leave with it (``leaving.push``); never taken for who owned a key
        # before it joined, since they joined with it (``History``).
        self.siblings = frozenset(sibling.rstrip("/") for sibling in siblings)
        self.membership = Membership(self.self_id)
        self.history = History(self.self_id, self._window(), self.siblings)
        self.client = PeerClient(token, self.settings.peer_timeout_seconds)
        self.loads = loadview.PeerLoads(replicas)
        self.handoff = Handoff(self.history, balancer, self._ask, clock, self._leaving_peers)
        self.forwarded = self.owner_unreachable = 0
        self.delegated = 0  # requests sent from here to the replica a sibling worker chose (proxy/decisions.py)
        self.abandoned = 0  # decisions made here for a sibling that had stopped waiting (relayed instead)
        self.leaving = False  # SIGTERM: this router owns no key any more (fleet/leaving.py)
        self.pushed = 0  # pins handed to their new owners while leaving
        self._owners: dict[str, str] = {}
        self._polls: dict[str, asyncio.Task] = {}
        self._tasks: list[asyncio.Task] = []
        self._scraper: asyncio.Task | None = None
        self._settled = False  # every first candidate was asked once (``settled``)

    # lifecycle
    def start(self) -> None:
        self.configure(self.settings)
        if self._selector:
            from .peerpods import watch_peers  # the Kubernetes client only where pods are watched
            self._tasks.append(asyncio.get_running_loop().create_task(
                _logged(watch_peers(self._selector, self._namespace, lambda ids: self.set_peers(PODS, ids))),
                name="peer-discovery"))

    async def stop(self) -> None:
        for task in [*self._tasks, *self._polls.values(), *([self._scraper] if self._scraper else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.loads.clear()
        await self.client.close()

    def configure(self, settings: FleetSettings) -> None:
        """Take new fleet settings live: the static peers, the load view, the poll timing (the watches open
        again with it: a watch asks for its interval and heartbeat when it opens)."""
        view_changed = settings.load_view != self.settings.load_view
        timing = (settings.poll_interval_seconds, settings.peer_timeout_seconds)
        retime = timing != (self.settings.poll_interval_seconds, self.settings.peer_timeout_seconds)
        self.settings = settings
        self.client.timeout = settings.peer_timeout_seconds
        self.history.window = self._window()
        self.set_peers(STATIC, [*self._cli_peers, *settings.peers])
        if retime:
            for peer_id, task in list(self._polls.items()):
                task.cancel()
                self._polls[peer_id] = self._follow_task(peer_id)
        if view_changed:
            self.loads.clear()
            if settings.load_view == "peers":
                for member in self.live_peers():
                    self.loads.change({}, member.loads)
        self._start_scraper(settings.load_view == "vllm")

    @property
    def ownership(self) -> Ownership:
        return self._cli_ownership or self.settings.ownership

    def _window(self) -> float:
        return self._idle_timeout() or DEFAULT_WINDOW

    def _start_scraper(self, wanted: bool) -> None:
        if wanted and self._scraper is None:
            self._scraper = asyncio.get_running_loop().create_task(_logged(loadview.scrape_vllm(
                self.replicas, self.client, self.settings.poll_interval_seconds)), name="vllm-loads")
        elif not wanted and self._scraper is not None:
            self._scraper.cancel()
            self._scraper = None
            if self.settings.load_view == "local":
                for replica in list(self.replicas.external()):
                    self.replicas.set_external(replica, 0)

    # membership
    def set_peers(self, source: str, ids: Sequence[str] | set[str]) -> None:
        added, dropped = self.membership.set_source(source, ids)
        for member in dropped:
            task = self._polls.pop(member.id, None)
            if task is not None:
                task.cancel()
            if member.live:
                self._left(member, "no longer named as a peer")
        for peer_id in added:
            self._polls[peer_id] = self._follow_task(peer_id)

    def _follow_task(self, peer_id: str) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(_logged(self._poll(peer_id)), name=f"peer {peer_id}")

    def live_peers(self) -> list[Member]:
        return [m for m in self.membership.peers.values() if m.live]

    def candidates(self) -> int:
        """How many other routers it knows of, answering or not (each may hold admin connections to it)."""
        return len(self.membership.peers)

    def _leaving_peers(self) -> list[str]:
        return [m.id for m in self.live_peers() if m.leaving]

    def members(self) -> frozenset[str]:
        return self.history.current

    def quorate(self) -> bool:
        """Whether it sees its siblings: a ``--workers N`` worker ready without them would route a key a sibling
        owns here, while the sibling, seeing both, sends the key's next turn to the owner: one session on two
        replicas. Its siblings, not a head count: in a fleet of pods, other pods' workers are members too."""
        return self.siblings <= self.history.current

    def siblings_seen(self) -> int:
        return len(self.siblings & self.history.current)

    def settled(self) -> bool:
        """Whether it has heard from its fleet: the router pods listed (``--peer-selector``) and each candidate
        peer polled once, answered or not. A router ready before would place the sessions it takes as a fleet of
        one, while their owner holds their pins. Once settled it stays so: a pod joining later is no reason to
        stop taking traffic."""
        if not self._settled:
            self._settled = (self.membership.named_by(PODS) or not self._selector) and all(
                m.asked for m in self.membership.peers.values())
        return self._settled

    def unasked(self) -> int:
        return sum(not m.asked for m in self.membership.peers.values())

    async def _poll(self, peer_id: str) -> None:
        """Follow a peer's loads while it is a candidate: a watch (``_follow``), opened again a poll interval
        after it ended; a failure counts against the peer's membership as a failed poll did."""
        while (member := self.membership.get(peer_id)) is not None:
            try:
                await self._follow(member)
            except Exception as error:  # a bug too: logged, and counted like silence, so following goes on
                if not isinstance(error, (Unreachable, PeerError, KeyError, TypeError, ValueError, AttributeError)):
                    log.exception("following router %s failed", peer_id)
                if self.membership.failed(peer_id, self.clock(), self.settings.peer_timeout_seconds):
                    self._left(member, str(error))
            member.asked = True
            await asyncio.sleep(self.settings.poll_interval_seconds)

    async def _follow(self, member: Member) -> None:
        """The peer's loads as it streams them: each change, looked at every poll interval, and a heartbeat
        often enough (a third of the peer timeout) that a silent peer is told from an idle one: an idle peer
        costs a line per heartbeat, not a request per interval. A router that answers one document (an older
        version) is asked again each poll interval (``_poll``)."""
        if member.http is None:
            info = await self.client.call("GET", f"{member.id}/fleet/v1/info")
            member.http, member.grpc = str(info["http"]).rstrip("/"), info.get("grpc")
        settings = self.settings
        heartbeat = settings.peer_timeout_seconds / 3  # at least the interval: FleetSettings checks it
        url = f"{member.id}/fleet/v1/loads?watch={settings.poll_interval_seconds:g}&heartbeat={heartbeat:g}"
        async with contextlib.aclosing(self.client.watch(url)) as answers:
            async for answer in answers:
                if self.membership.get(member.id) is not member:
                    return  # dropped while we waited
                self._loads_answered(member, answer)
                member.asked = True

    def _loads_answered(self, member: Member, answer: dict) -> None:
        # a peer's word: a negative count would make its replica look idler than it is, and no replica holds more
        # than MAX_PEER_LOAD (a replica's counts are C integers: a larger one would not fit their sum)
        loads = {str(replica): min(max(0, int(count)), MAX_PEER_LOAD) for replica, count in answer["loads"].items()}
        if self.rl is not None and "rl" in answer:
            self.rl.adopt(answer["rl"])  # how a router that missed a pause, resume or update learns it
        old = member.loads if member.live else {}
        joined = self.membership.answered(member.id, self.clock())
        member.loads = loads
        self.handoff.gone.discard(member.id)  # it answers: a previous owner to ask again (one timeout made it gone)
        if self.settings.load_view == "peers":
            self.loads.change(old, loads)
        if answer.get("leaving") is True and not member.leaving:
            self.peer_leaving(member.id, done=False)
        elif (joined and not member.leaving) or (answer.get("leaving") is False and member.leaving):
            member.leaving = False  # a leaving router never says so: this is a new one there (a restart)
            self.handoff.departed.discard(member.id)
            log.info("router %s joined the fleet", member.id)
            self._changed()

    def _left(self, member: Member, why: str) -> None:
        member.live = member.leaving = False  # if it answers again, it is a new router there
        if self.settings.load_view == "peers":
            self.loads.change(member.loads, {})
        member.loads = {}
        member.http = None  # asked again when it comes back (it may come back elsewhere)
        log.warning("router %s left the fleet: %s", member.id, why)
        self._changed()

    def stop_owning(self) -> None:
        """This router is leaving: from now on every key is owned by one of the others."""
        self.leaving = True
        self._owners.clear()
        self.balancer.changes.bump()  # the native lane's sticky hit reads ``leaving`` again (``decide.open_now``)

    def peer_leaving(self, peer_id: str, done: bool) -> None:
        """A peer is leaving the fleet: it owns no key from now on; ``done``: it handed over every pin. Only a
        member, or one of a recent member set (it may be out of discovery already), is recorded: anyone with the
        admin token could send any id."""
        member = self.membership.get(peer_id)
        if done and (member is not None or self.history.knows(peer_id)):
            self.handoff.departed.add(peer_id)
        if member is not None and not member.leaving:
            member.leaving = True
            log.info("router %s is leaving the fleet: its sessions move to the other routers", peer_id)
            self._changed()

    def _changed(self) -> None:
        self.history.update(self.membership.members(), self.clock())
        self._owners.clear()

    # the data path
    def owner_of(self, key: str) -> Member | None:
        """The member owning ``key`` when it is another router (None: this router decides)."""
        members = self.history.current
        if self.leaving:  # it owns nothing: the owner among the others, if any
            members = members - {self.self_id}
            if not members:
                return None
        elif len(members) == 1 or self.ownership == "entry":
            return None
        owner_id = self._owners.get(key)
        if owner_id is None:
            if len(self._owners) >= OWNER_CACHE:
                self._owners.clear()
            owner_id = self._owners[key] = owner(key, members)
        return None if owner_id == self.self_id else self.membership.get(owner_id)

    def hopped(self, mark: bytes | None) -> bool:
        """Whether a request's hop mark (``proxy/owner.py``) names a router of this fleet: a member or a candidate
        peer, the one a forward comes from. A client's own mark naming anyone else is not honoured, so a
        client cannot make a router decide a key it does not own (and pin it there beside the owner's pin)."""
        if mark is None:
            return False
        sender = mark.decode("latin-1")
        return sender == self.self_id or sender in self.membership.peers

    def decided_here(self, key: str, hopped: bool) -> bool:
        """Whether ``via_owner`` would return False at once, with nothing to wait for: no owner to forward to
        and no pin to fetch or look up first (the traffic listener's fast path serves such a request)."""
        owner = self.owner_of(key)
        if owner is not None and (not hopped or self.leaving):
            return False
        if self.ownership == "entry":
            return not self._to_ask(key)
        believed = owner.id if owner is not None and hopped else None
        return not ((owner is None or believed) and self.handoff.needed(key, believed))

    async def via_owner(self, key: str, hopped: bool, attempt: Callable[[Member], Awaitable[bool]]) -> bool:
        """Send a keyed request through its owner: True when an owner answered it, False to decide here.

        An owner gone for good (refused, reset) leaves the membership at once,
        and the request goes to the key's owner without it (nothing reached the
        first). Deciding here as the key's owner, the pin is first fetched from
        a previous owner (``handoff``); a request another router sent here
        (``hopped``) is decided here even when this router's view names another owner,
        unless this router is leaving: it owns nothing, so it sends the request on to the
        key's owner (who decides it: two hops at most). With entry ownership nothing is
        forwarded unless this router is leaving, and a key without a pin here is first
        looked up at every peer.
        """
        owner = self.owner_of(key)
        if owner is not None and (not hopped or self.leaving):
            for _ in range(2):
                if await attempt(owner):
                    return True
                failed, owner = owner, self.owner_of(key)
                if owner is None or owner is failed:
                    break
        if self.ownership == "entry":
            await self._look_up(key)
            return False
        believed = owner.id if owner is not None and hopped else None
        if (owner is None or believed) and self.handoff.needed(key, believed):
            await self.handoff.fetch(key, believed)
        return False

    async def _look_up(self, key: str) -> None:
        """Entry ownership: pull ``key``'s pin from whichever peer holds it (leaving peers included, not those
        that handed every pin over); with none found and a peer silent, the session is decided here uninformed."""
        peers = self._to_ask(key)
        if peers and not await self.handoff.lookup(key, peers, self.settings.lookup_timeout_seconds):
            self.owner_unreachable += 1

    def _to_ask(self, key: str) -> list[str]:
        """Entry ownership: the peers to ask for ``key``'s pin (none when it is pinned here)."""
        if self.balancer.pinned(key) is not None:
            return []
        return [m.id for m in self.live_peers() if m.id not in self.handoff.departed]

    def adopt(self, pins: list[tuple[str, str, float]], pusher: str | None,
              redirect: bool) -> tuple[int, dict[str, str]]:
        """Pins the leaving peer ``pusher`` pushed here: (how many were taken, the keys left to their owner).

        The pusher chose this router by its own view of the members, which may
        lack a router that joined a moment ago, or some workers of a new pod. With
        ``redirect``, a pin whose owner in this router's view is another member
        (not the pusher) is not taken but named with that owner, and the pusher,
        which holds it until then, pushes it there (``leaving.push``). Taking it
        here instead, the owner would not know to ask this router for it.
        """
        if pusher is not None and (member := self.membership.get(pusher)) is not None and not member.leaving:
            self.peer_leaving(pusher, done=False)  # only a leaving router pushes: it owns nothing, whatever we missed
        elsewhere: dict[str, str] = {}
        mine: list[tuple[str, str, float]] = []
        for pin in pins:
            owner = self.owner_of(pin[0]) if redirect else None
            if owner is not None and owner.id != pusher:
                elsewhere[pin[0]] = owner.id
            else:
                mine.append(pin)
        return self.handoff.receive(mine), elsewhere

    def unreachable(self, member: Member, gone: bool) -> None:
        """Forwarding to ``member`` failed before any byte came back; ``gone``: refused or reset, not slow."""
        self.owner_unreachable += 1
        if gone and member.live and self.membership.failed(member.id, self.clock(), 0.0, gone=True):
            self._left(member, "refused a forwarded request")

    async def _ask(self, peer: str, key: str, timeout: float | None) -> tuple[str, float] | None:
        """``peer`` gives up ``key``'s pin: (its replica, seconds since its last use), or None when it held none."""
        answer = await self.client.call("POST", f"{peer}/fleet/v1/handoff", {"key": key, "from": self.self_id},
                                        timeout)
        replica = answer.get("replica") if isinstance(answer, dict) else None
        if not isinstance(replica, str):
            return None
        idle = answer.get("idleSeconds")
        return replica, float(idle) if isinstance(idle, (int, float)) and not isinstance(idle, bool) else 0.0

    # what /status and /metrics show
    def peer_load_ages(self) -> dict[str, float]:
        now = self.clock()
        return {m.id: round(now - m.answered, 3) for m in self.live_peers() if m.answered is not None}

    def status(self) -> dict:
        return {"self": self.self_id, "ownership": self.ownership, "members": sorted(self.members()),
                "forwarded": self.forwarded, "delegated": self.delegated, "abandoned": self.abandoned,
                "lookups": self.handoff.lookups,
                "ownerUnreachable": self.owner_unreachable, "handoffs": self.handoff.handoffs,
                "replaced": self.handoff.replaced, "loadView": self.settings.load_view,
                "leaving": self.leaving, "pushed": self.pushed,
                "peerLoadAgeSeconds": self.peer_load_ages()}


async def _logged(work) -> None:
    """Run a background job; a bug is logged instead of vanishing with the task."""
    try:
        await work
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("fleet background task failed")
