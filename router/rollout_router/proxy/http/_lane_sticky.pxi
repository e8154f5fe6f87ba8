# The sticky hit and its answer, in C: ``LaneGlue.route`` and ``finish`` for the request most traffic is.
#
# Issue 22: with the lane, what the router costs above HAProxy is its two Python calls per request, a dozen
# frames and some forty objects (benchmarks/lane_timed.py). A request whose session is pinned to a routable
# replica, under the default policy (``AffinityPolicy``) keeping it (no margin, full determinism, or its
# replica within the margin of the least loaded), needs no choice: its pin's last use moves and its replica
# counts one more in flight.
# ``Sticky`` does that, and records the answer of such a request, on the router's own objects (the policy's
# ``SessionTable``, the ``ReplicaSet``'s replicas and ``LoadIndex``, the decision counters, the metrics
# series) as the Python does, with no frame, holding the objects that live as long as the router; a measured
# turn's answer is read by the turn's own methods. Anything else declines before changing anything, and
# ``LaneGlue`` does it: a new session, a pin to move, a replica marked down, an error answer, a pause, a key
# another router or worker decides, new settings. tests/test_lane_sticky.py
# routes the same requests both ways and compares what they leave.

cdef extern from "Python.h":
    PyObject* PyDict_SetDefault(object mapping, object key, object default) except NULL  # a borrowed reference


cdef class Sticky:
    """The sticky hit's state: the router's long-lived objects, read once (``LaneGlue`` builds it)."""

    cdef object context, rl, balancer, metrics, margin, kept_first_byte, http, grpc
    cdef object pool_of, sampled, routing_type  # ``routing_type``: ``outcome.Routing``, the token of each request
    cdef dict live, paths, pools, http_moved, grpc_moved
    cdef object down                     # ``ReplicaSet``'s replicas marked down (a dict: empty, or it declines)
    cdef object policy_type, clock, slot_bits, slot_mask, used_mask, unused
    cdef Py_ssize_t scanned
    cdef object policy, table, pins, move_to_end, counters  # the policy last seen, and its table's parts
    cdef list slots
    cdef object kept                     # ``KeptDecisions`` (a dict)
    cdef public object settings          # the settings ``LaneGlue`` synced to: other ones, and it declines
    cdef public long long max_key
    cdef public bint group_fields
    cdef public long long hits, answers  # requests routed and finished here (the others: ``LaneGlue``)
    cdef public long long answering      # begun here less ended here: ``HttpProxy.answering`` adds it

    def __init__(self, glue, tuple parts):
        context = glue.context
        replicas = context.replicas
        self.context, self.rl, self.balancer = context, context.rl, context.balancer
        self.metrics, self.margin = context.metrics, context.metrics.margin
        self.kept_first_byte = self.margin.kept_first_byte
        self.live, self.down = replicas._live, replicas._down
        self.http, self.grpc = replicas._http, replicas._grpc
        self.http_moved, self.grpc_moved = self.http._moved, self.grpc._moved
        self.paths, self.pools, self.pool_of = glue._paths, glue.pools, glue.pool
        (self.policy_type, self.clock, self.sampled, self.routing_type, self.scanned, self.slot_bits, self.slot_mask,
         self.used_mask, self.unused) = parts

    cdef bint _adopt(self, object policy) except -1:
        """A policy not seen before (a reload built one): its table's parts, when it is one ``route`` knows."""
        self.policy = policy
        if type(policy) is not self.policy_type or self.balancer._clock is not self.clock:
            self.pins = None
            return False
        table = self.table = policy.table
        self.pins, self.move_to_end, self.slots = table._pins, table._pins.move_to_end, table._replicas
        self.kept, self.counters = policy._kept, policy.counters
        return True

    cdef bint _within(self, object margin, long load) except -1:
        """``AffinityPolicy._keeps`` with a margin: the pinned replica's ``load`` within ``margin`` of the lowest (up
        to ``LoadIndex.SCANNED`` replicas a scan, as ``LoadIndex.min``, which is called above that)."""
        cdef Py_ssize_t at = 0
        cdef PyObject* replica
        cdef PyObject* value
        cdef long low
        if margin is None:
            return False
        if PyDict_Size(self.http) > self.scanned:
            low = self.http.min()
        else:
            low = load
            while PyDict_Next(self.http, &at, &replica, &value):
                if <long><object>value < low:
                    low = <long><object>value
        return load - low <= <double>margin

    cdef object route(self, bytes path, object key, object group, double now):
        """``LaneGlue.route`` for a keyed request whose pin is kept; None: ``LaneGlue.route`` decides."""
        cdef PyObject* found
        cdef long inflight
        cdef double rate, credit = 0
        cdef object context = self.context
        if key is None or group is not None or self.group_fields or PyBytes_GET_SIZE(key) > self.max_key:
            return None
        if context.settings is not self.settings or self.rl.paused:
            return None
        if PyDict_Size(self.down) and now >= self.down.earliest:  # a mark-down has ended: ``ReplicaSet.loads``
            return None
        found = PyDict_GetItem(self.paths, path)
        if found == NULL or <object>found != 1:  # not a forwarded path read for its session key (``lane.KEYED``)
            return None
        policy = self.balancer.policy
        if policy is not self.policy:
            self._adopt(policy)
        if self.pins is None:
            return None
        try:
            session = (<bytes>key).decode()
        except UnicodeDecodeError:
            return None
        fleet = context.fleet
        if fleet is not None and (fleet.leaving or not fleet.decided_here(session, False)):  # (as LaneGlue asks)
            return None
        found = PyDict_GetItem(self.pins, session)
        if found == NULL:
            return None
        packed = <object>found
        table_ttl = self.table.idle_ttl
        if table_ttl is not None and now - ((packed >> self.slot_bits) & self.used_mask) / 1000 > table_ttl:
            return None
        replica_id = self.slots[packed & self.slot_mask]
        found = PyDict_GetItem(self.http, replica_id)
        if found == NULL:  # not routable now: the policy re-pins it
            return None
        if not policy._every_pin_kept and not self._within(policy.margin, <long><object>found):
            return None  # the margin breaks it, or another rule of the policy decides (full determinism, none)
        found = PyDict_GetItem(self.kept, replica_id)
        if found == NULL:
            return None
        decision = <object>found
        found = PyDict_GetItem(self.live, replica_id)
        if found == NULL:
            return None
        replica = <object>found
        found = PyDict_GetItem(self.pools, replica_id)
        pool = <object>found if found != NULL else self.pool_of(replica_id)
        margin = self.margin
        turn = None
        rate = margin.rate
        if rate:  # ``MarginMeter.sample``, its credit written below with the rest
            credit = margin._credit + rate
            if credit >= 1:
                credit -= 1
                turn = self.sampled(now)
        # kept: what AffinityPolicy.decide (SessionTable.hit), ReplicaSet.take and attempts.taken do
        self.pins[session] = packed & self.unused | (<long long>ceil(now * 1000)) << self.slot_bits
        self.move_to_end(session)
        self.counters.affinity_kept += 1
        inflight = replica.inflight + 1
        replica.inflight = inflight
        _move(replica, replica_id, inflight, self.http, self.http_moved, self.grpc, self.grpc_moved)
        if rate:
            margin._credit = credit
        self.answering += 1
        self.hits += 1
        return pool, turn is not None, self.routing_type(session, None, decision, replica, turn, now)

    cdef bint finish(self, object token, object code, int status, object failure, double first_at, object tail,
                     double now) except -1:
        """``outcome.answered`` for a request routed here or by ``LaneGlue`` (an ``outcome.Routing``, read through its
        declared fields) and answered below 400 (its turn, when it has one, recorded by the turn's own methods);
        False: ``LaneGlue.finish`` records it."""
        cdef PyObject* found
        cdef long inflight
        cdef double started
        if type(token) is not self.routing_type or failure is not None or not 0 < status < 400 or code is None:
            return False
        if not token.held:  # put back already (``outcome.put_back``): nothing to give back
            return False
        turn = token.turn
        replica = token.replica
        replica_id = replica.id
        found = PyDict_GetItem(self.live, replica_id)
        inflight = replica.inflight
        if found == NULL or <object>found is not replica or inflight <= 0:  # ``ReplicaSet.put``'s other cases
            return False
        found = PyDict_GetItem(self.metrics._children, (replica_id, code))
        if found == NULL:  # the series not looked up yet (``Metrics.observe``)
            return False
        children = <tuple>(<object>found)
        started = token.start
        if turn is not None:
            turn.ended(first_at, tail, replica_id)
        replica.failures = 0  # OutlierDetector.answered, below 500
        replica.server_errors = 0
        children[0].value += 1
        _observe(children[1], now - started)
        inflight -= 1
        replica.inflight = inflight
        token.held = False
        _move(replica, replica_id, inflight, self.http, self.http_moved, self.grpc, self.grpc_moved)
        if turn is not None:
            self.metrics.turn(turn)
        elif first_at:
            _observe(self.kept_first_byte, first_at - started)
        self.answering -= 1
        self.answers += 1
        return True


cdef void _move(object replica, object replica_id, long inflight, object http, dict http_moved, object grpc,
                dict grpc_moved) except *:
    """``LoadIndex.move`` in each index holding a live replica whose count changed (``ReplicaSet.take``/``put``):
    the load it was filed at kept in ``_moved`` before the index lets go of it."""
    load = inflight + replica.external
    _moved(http, http_moved, replica_id, load)
    if replica.grpc_target is not None:
        _moved(grpc, grpc_moved, replica_id, load)


cdef inline void _moved(object index, dict moved, object replica_id, object load) except *:
    cdef PyObject* found = PyDict_GetItem(index, replica_id)
    if found == NULL:
        return
    old = <object>found  # a reference of our own: setting the new load may free the old one
    PyDict_SetDefault(moved, replica_id, old)
    PyDict_SetItem(index, replica_id, load)


cdef void _observe(object child, double value) except *:
    """``HistogramChild.observe``: the bucket of ``value`` (the first bound >= it; the last is +Inf), and the sum."""
    cdef tuple bounds = child.bounds
    cdef Py_ssize_t low = 0, high = len(bounds), middle
    while low < high:
        middle = (low + high) >> 1
        if <double>bounds[middle] < value:
            low = middle + 1
        else:
            high = middle
    counts = <list>child.counts
    counts[low] += 1
    child.sum += value
