# The sticky hit and its answer, in C: ``LaneGlue.route`` and ``finish`` for the request most traffic is.
#
# With the lane, what the router costs above HAProxy is its two Python calls per request, a dozen frames and
# some forty objects (benchmarks/lane_timed.py). A request whose session is pinned to a routable replica, under
# the default policy (``AffinityPolicy``) keeping it, needs no choice: the kept-pin rule (``core.kept``, the
# policy's own) moves its pin's last use, the kept decision is counted (``core.counters.kept_decision``), and the
# ledger (``core.ledger``) counts its replica one more in flight. ``Sticky`` does that, and records the answer of
# such a request (``core.answers``, as ``outcome.answered`` does), through the core's declared interfaces
# (``core/*.pxd``) and the public attributes of the router's objects, with no frame, holding the objects that live
# as long as the router; a measured turn's answer is read by the turn's own methods. Anything else declines before
# changing anything, and ``LaneGlue`` does it: a new session, a pin to move, a replica marked down, an error
# answer, a pause or a router leaving its fleet (forwarding's ``open_now``, asked after each change), a key another
# router or worker decides, new settings.
# tests/test_lane_sticky.py routes the same requests both ways and compares what a user sees.

from rollout_router.core.changes cimport Changes
from rollout_router.core.kept cimport kept
from rollout_router.core.answers cimport answered_ok, turn_recorded
from rollout_router.core.counters cimport DecisionCounts, kept_decision
from rollout_router.core.ledger cimport take
from rollout_router.core.loads cimport LoadIndex
from rollout_router.core.pins cimport SessionTable
from rollout_router.core.routing cimport Routing, routed
from rollout_router.core.tallies cimport HistogramChild, Sampler


cdef class Sticky:
    """The sticky hit's state: the router's long-lived objects, read once (``LaneGlue`` builds it)."""

    cdef object context, balancer, clock, sampled, open_now, policy_type, pool_of, record_turn
    cdef dict live, paths, pools, series
    cdef object down                     # ``ReplicaSet.marked_down`` (a dict: empty, or it declines)
    cdef LoadIndex http, grpc
    cdef Sampler sampler
    cdef HistogramChild kept_first_byte
    cdef Changes changes                 # ``Runtime.changes``: what follows is read again when it moves
    cdef long long seen                  # its count when they were read (-1: read them again)
    cdef bint ready                      # then: the settings synced to live, open, a policy ``route`` knows
    cdef object fleet                    # then: ``Runtime.fleet``
    cdef object policy, kept_decisions   # the policy last seen, and its parts
    cdef DecisionCounts counters
    cdef SessionTable table              # its session table; None: not a policy ``route`` knows
    cdef object synced                   # the settings ``LaneGlue`` synced to: other ones, and it declines
    cdef long long max_key
    cdef bint group_fields
    cdef public long long hits, answers  # requests routed and finished here (the others: ``LaneGlue``)
    cdef public long long answering      # begun here less ended here: ``HttpProxy.answering`` adds it

    def __init__(self, glue, tuple parts):
        context = glue.context
        replicas = context.replicas
        self.context, self.balancer = context, context.balancer
        self.record_turn = context.metrics.turn  # ``Metrics.turn``, bound once
        self.live, self.down = replicas.members, replicas.marked_down
        self.http, self.grpc = replicas.indexes
        self.series = context.metrics.series
        margin = context.metrics.margin
        self.sampler, self.kept_first_byte = margin.sampler, margin.kept_first_byte
        self.paths, self.pools, self.pool_of = glue.paths, glue.pools, glue.pool
        # ``open_now``: forwarding's own check (not paused, not leaving), asked again after a change
        self.policy_type, self.clock, self.sampled, self.open_now = parts
        self.changes, self.seen = context.changes, -1

    def sync(self, settings, long long max_key, bint group_fields):
        """``LaneGlue`` synced to ``settings`` (their maxKeyBytes, whether a group key is read from the body): the
        hit reads the router's state again."""
        self.synced, self.max_key, self.group_fields, self.seen = settings, max_key, group_fields, -1

    cdef int _read(self) except -1:
        """What the hit needs from the router's Python objects, read again after a change (``Runtime.changes``)."""
        context = self.context
        self.seen = self.changes.count
        policy = self.balancer.policy
        if policy is not self.policy:
            self._adopt(policy)
        self.fleet = context.fleet
        self.ready = self.table is not None and context.settings is self.synced and self.open_now(context)
        return 0

    cdef bint _adopt(self, object policy) except -1:
        """A policy not seen before (a reload built one): its table and parts, when it is one ``route`` knows."""
        self.policy = policy
        if type(policy) is not self.policy_type or self.balancer.clock is not self.clock:
            self.table = None
            return False
        self.table = policy.table
        self.kept_decisions, self.counters = policy.kept_decisions, policy.counters
        return True

    cdef object route(self, bytes path, object key, object group, double now):
        """``LaneGlue.route`` for a keyed request whose pin is kept; None: ``LaneGlue.route`` decides."""
        cdef PyObject* found
        if key is None or group is not None or self.group_fields or PyBytes_GET_SIZE(key) > self.max_key:
            return None
        if self.changes.count != self.seen:
            self._read()
        if not self.ready:
            return None
        if PyDict_Size(self.down) and now >= self.down.earliest:  # a mark-down has ended: ``ReplicaSet.loads``
            return None
        found = PyDict_GetItem(self.paths, path)
        if found == NULL or <object>found != 1:  # not a forwarded path read for its session key (``wire.routes.KEYED``)
            return None
        try:
            session = (<bytes>key).decode()
        except UnicodeDecodeError:
            return None
        fleet = self.fleet
        if fleet is not None and not fleet.decided_here(session, False):  # ``route_or_decline`` asks a sibling
            return None
        replica_id = kept(self.table, self.http, session, now, self.policy.keep_margin)
        if replica_id is None:  # no live pin, its replica not routable, or the margin breaks it: the policy decides
            return None
        # kept: what AffinityPolicy.decide does after ``kept``, then ``ReplicaSet.take`` and ``attempts.taken``
        decision = kept_decision(self.counters, self.kept_decisions, replica_id)
        replica = self.live[replica_id]  # routable, so live
        found = PyDict_GetItem(self.pools, replica_id)
        pool = <object>found if found != NULL else self.pool_of(replica_id)
        turn = self.sampled(now) if self.sampler.rate and self.sampler.sample() else None
        take(replica, self.http, self.grpc)
        self.answering += 1
        self.hits += 1
        return pool, turn is not None, routed(session, None, decision, replica, turn, now)

    cdef bint finish(self, object token, object code, int status, object failure, double first_at, object tail,
                     double now) except -1:
        """``outcome.answered``'s case of an answer below 400 (``core.answers.answered_ok``) for a request routed here
        or by ``LaneGlue`` (an ``outcome.Routing``, read through its declared fields; its turn, when it has one,
        recorded by the turn's own methods); False: ``LaneGlue.finish`` records it."""
        cdef Routing routing
        if type(token) is not Routing or failure is not None or not 0 < status < 400 or code is None:
            return False
        routing = <Routing>token
        if not answered_ok(routing, self.live, self.series, code, now, self.http, self.grpc):
            return False  # put back already, its replica not live or counted, or its series not looked up yet
        turn = routing.turn  # the turn's end read by its own methods first, then recorded as ``outcome._turn`` does
        if turn is not None:
            turn.ended(first_at, tail, routing.replica.id)
        turn_recorded(self.record_turn, self.kept_first_byte, turn, routing.start, first_at)
        self.answering -= 1
        self.answers += 1
        return True
