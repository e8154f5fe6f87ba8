# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The native lane of the HTTP traffic port: the common request, parsed, forwarded and relayed in C.

Issue 22: the router's Python data path costs about 2.3x what HAProxy costs per request, and no Python
left in it is dominant. This lane takes the request most traffic is (a keep-alive HTTP/1.1 GET or POST
with its body whole, a forwarded path, a key in a header, an idle pooled connection to its replica) and
does in C what ``connection/client.py``, ``connection/relay.py`` and ``connection/upstream.py`` do for it,
calling the router's Python twice: ``route`` when the request is whole (the policy, the lease, the checks the
traffic port's fast path makes) and ``finish`` when its answer has ended (``outcome.answered``: the metrics,
passive health, the replica put back), its ``outcome.Routing`` handed back as the token ``route`` returned, unless the request
is a sticky hit the lane routes and records itself (``_lane_sticky.pxi``). Everything
else goes to the Python path, which stays the reference: the lane hands the connection over
(``Lane.hand_over``: the bytes it holds from the current request on, and when it had routed the request,
its routing) and the Python path parses those bytes from the start, so every error answer, limit and
odd request is answered by the code that always answered it. A connection comes back to the lane when
the Python path is idle on it (``glue.py``).

The readers of a request head (``_lane_requests.pxi``) and of a response head and chunked body
(``_lane_responses.pxi``) work on C buffers with explicit lengths. The relay (``_lane_relay.pxi``) is
``connection.relay.Exchange`` for the answers the lane forwards: the same states, the same client heads (built by
``heads.client_head`` once per shape and replica), the same error answers (made by the Python path's
``error_bytes``), the same bounds.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem, PyDict_Size
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.object cimport PyObject
from libc.string cimport memcmp, memcpy, memmove

from rollout_router.core.budget cimport Share


cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clock, timespec* ts)
    int CLOCK_MONOTONIC


cdef inline double monotonic() noexcept:
    """``time.monotonic()`` (the same clock: CPython reads CLOCK_MONOTONIC)."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


include "_lane_requests.pxi"
include "_lane_responses.pxi"
include "_lane_sticky.pxi"

SOURCE_HASH = LANE_SOURCE_HASH  # of the sources it was built from (hatch_build.py): glue.py runs no stale lane
# The bounds the lane's parsers stop at, handing over: connection/client.py's and connection/relay.py's (tests/test_lane.py compares them).
BOUNDS = {"MAX_HEAD": MAX_HEAD, "MAX_HEADERS": MAX_FIELDS, "MAX_RESPONSE_HEAD": MAX_RESPONSE_HEAD,
          "MAX_RESPONSE_FIELDS": MAX_FIELDS, "BUFFER_LIMIT": BUFFER_LIMIT, "TAIL_BYTES": TAIL_BYTES,
          "DONE_TAIL": DONE_TAIL, "POOL_SIZE": POOL_SIZE}

# The reasons of ``Lane.handovers``, by their W_ number (_lane_requests.pxi).
HANDOVER_REASONS = ("method", "target", "version", "header", "hop_by_hop", "fleet_hop", "host", "size", "body",
                    "budget", "declined", "slow", "refused", "connection_limit", "backlog")
RELAY = "relay"  # handed over with a request a sibling worker would not route: the Python path relays it

cdef enum:
    POOL_SIZE = 64                 # connection/upstream.py POOL_SIZE
    PAUSE_AT = 262144              # bytes waiting behind a request being answered before reading pauses
    KEEP_CAPACITY = 65536          # a buffer larger than this is given back once empty


# --- growable byte buffers ---

cdef struct Buf:
    char* data
    Py_ssize_t size
    Py_ssize_t cap


cdef int buf_add(Buf* b, const char* s, Py_ssize_t n) except -1:
    cdef Py_ssize_t need = b.size + n, cap
    cdef char* grown
    if need > b.cap:
        cap = b.cap * 2 if b.cap * 2 > need else need
        if cap < 1024:
            cap = 1024
        grown = <char*>PyMem_Realloc(b.data, cap)
        if grown == NULL:
            raise MemoryError()
        b.data, b.cap = grown, cap
    if n:
        memcpy(b.data + b.size, s, n)
    b.size = need
    return 0


cdef void buf_drop(Buf* b, Py_ssize_t n) noexcept:
    """Remove the first ``n`` bytes; an emptied buffer that grew large is freed."""
    if n >= b.size:
        b.size = 0
        if b.cap > KEEP_CAPACITY:
            buf_free(b)
        return
    memmove(b.data, b.data + n, b.size - n)
    b.size -= n


cdef void buf_free(Buf* b) noexcept:
    PyMem_Free(b.data)
    b.data, b.size, b.cap = NULL, 0, 0


cdef bytes buf_bytes(Buf* b, Py_ssize_t start=0):
    return PyBytes_FromStringAndSize(b.data + start, b.size - start)


cdef class Lane:
    """What the lane shares per traffic listener: the Python it calls, the budget, the key names, the counts.

    ``glue`` (``lane.LaneGlue``) supplies ``route``, ``finish``, ``failed``, ``refused``, ``hand_over``,
    ``connect``, ``opened``, ``closed``, ``head`` and ``exception``; the listener's ``share`` of the byte budget
    counts what its requests hold (``core.budget``, in C)."""

    cdef public double now                   # the sweep's clock (``Listener.now``), set by the glue
    cdef public double idle_seconds          # connection/client.py's IDLE_SECONDS and WRITE_STALL_SECONDS, set by the glue
    cdef public double write_stall_seconds
    cdef public long long write_high_water   # connection/client.py's WRITE_HIGH_WATER
    cdef public long long max_body           # ``maxBodyBytes`` and ``maxBufferedBytes``, kept live by the glue
    cdef public long long max_buffered
    cdef public long long forwarded          # requests answered here
    cdef public bint closing                 # stopping: every request goes to the Python path, which closes after it
    cdef object glue, listener, versions
    cdef Share share                         # ``Listener.share``
    cdef object _route, _finish, _failed, _hand_over, _connect, _opened, _closed, _head, _exception
    cdef public Sticky sticky                # the sticky hit in C, or None (``LaneGlue``)
    cdef set active                          # answers in progress: ``HttpProxy.active``, shared with the Python path
    cdef tuple names_ref                     # the key header names, lower-cased (keeps ``names`` alive)
    cdef const char* names[MAX_NAMES]
    cdef Py_ssize_t sizes[MAX_NAMES]
    cdef int count, session_count
    cdef long long handovers[W_REASONS]

    def __init__(self, glue, listener, set active, versions):
        self.glue, self.listener, self.share, self.versions = glue, listener, listener.share, versions
        self._route, self._finish, self._failed = glue.route, glue.finish, glue.failed
        self._hand_over, self._connect, self._head = glue.hand_over, glue.connect, glue.head
        self._opened, self._closed, self._exception = glue.opened, glue.closed, glue.exception
        self.active = active
        self.now = listener.now
        self.names_ref = ()

    def set_names(self, tuple session, tuple group):
        """The key headers, lower-cased, session then group, in precedence order; False when there are more
        than the lane looks for (it then hands every request over)."""
        cdef tuple names = session + group
        cdef int i
        if len(names) > MAX_NAMES:
            self.count = -1
            return False
        self.names_ref = names
        for i in range(len(names)):
            self.names[i] = PyBytes_AS_STRING(names[i])
            self.sizes[i] = PyBytes_GET_SIZE(names[i])
        self.count, self.session_count = len(names), len(session)
        return True

    cpdef object route(self, object client, bytes path, long long size, int key_at, object key, int group_at,
                       object group, double now):
        """A whole request's routing (``LaneGlue.route``'s answer): the sticky hit here, or ``LaneGlue.route``."""
        cdef object routed = None
        if self.closing:
            return None
        if self.sticky is not None:
            try:
                routed = self.sticky.route(path, key, group, now)
            except Exception as error:  # a bug (before it changed anything): logged, and LaneGlue routes it
                self.report(error)
        if routed is None:
            routed = self._route(client, path, size, key_at, key, group_at, group, now)
        return routed

    cpdef object finish(self, object token, object code, int status, object failure, double first_at, object tail,
                        double now):
        """An answer's end recorded: by ``Sticky.finish``, or ``LaneGlue.finish``."""
        if self.sticky is None or not self.sticky.finish(token, code, status, failure, first_at, tail, now):
            self._finish(token, code, status, failure, first_at, tail, now)

    def handover_counts(self):
        """Requests handed to the Python path, by reason (``HANDOVER_REASONS``)."""
        return {HANDOVER_REASONS[i]: self.handovers[i] for i in range(W_REASONS)}

    cdef bint charge(self, long long size) except -1:
        return self.share.charge(size, self.max_buffered)

    cdef void uncharge(self, long long size) except *:
        if size:
            self.share.release(size)

    cdef void report(self, what) noexcept:
        """A bug in the Python the lane calls: logged, and the lane goes on (``glue.exception``)."""
        try:
            self._exception(what)
        except BaseException:
            pass


cdef class Pool:
    """Idle keep-alive connections to one replica, most recently used first (``upstream.ReplicaPool``), and
    the client heads of its answers by shape."""

    cdef public str replica
    cdef public bytes prefix, host_header
    cdef public object host, port, ssl
    cdef list idle
    cdef dict heads               # client heads by shape (``Upstream.client_head``)
    cdef Buf last                 # the last shape, and its head
    cdef object last_built
    cdef object version

    def __init__(self, str replica, bytes prefix, bytes host_header, host, port, ssl):
        self.replica, self.prefix, self.host_header = replica, prefix, host_header
        self.host, self.port, self.ssl = host, port, ssl
        self.idle, self.heads, self.version = [], {}, None

    def __dealloc__(self):
        buf_free(&self.last)

    def __len__(self):
        return len(self.idle)

    cdef Upstream take(self):
        cdef Upstream up
        while self.idle:
            up = self.idle.pop()
            if not up.closed:
                return up
        return None

    cdef void give_back(self, Upstream up, double now) except *:
        if up.closed or len(self.idle) >= POOL_SIZE:
            up.close()
            return
        up.idle_since = now
        self.idle.append(up)

    cdef void forget(self, Upstream up) except *:
        if up in self.idle:
            self.idle.remove(up)

    def close_idle(self, double older_than):
        """Close connections idle since before ``older_than`` (all of them with ``inf``)."""
        cdef Upstream up
        for up in [up for up in self.idle if up.idle_since < older_than]:
            self.idle.remove(up)
            if up.transport is not None:
                up.transport.close()


include "_lane_client.pxi"
include "_lane_relay.pxi"


# --- the readers as Python sees them: tests/test_lane_parse.py holds them against llhttp ---

def read_request_head(bytes data, tuple names=()):
    """``parse_request`` over ``data`` fed one byte at a time and whole: ``"incomplete"``, the W_ reason's
    name, or what the lane would forward (method, target, the forwarded fields, the key values, the body's
    length, the head's length). Both feeds must agree."""
    cdef Head whole, trickled
    cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef const char* keys[MAX_NAMES]
    cdef Py_ssize_t sizes[MAX_NAMES]
    cdef Py_ssize_t i, n = len(data)
    cdef int count = len(names), a, b = P_INCOMPLETE
    if count > MAX_NAMES:
        raise ValueError(f"at most {MAX_NAMES} key names")
    for i in range(count):
        keys[i], sizes[i] = PyBytes_AS_STRING(names[i]), len(names[i])
    head_reset(&whole)
    head_reset(&trickled)
    a = parse_request(s, n, &whole, keys, sizes, count)
    for i in range(1, n + 1):
        b = parse_request(s, i, &trickled, keys, sizes, count)
        if b != P_INCOMPLETE:
            break
    if a != b or (a == P_SIMPLE and whole.length != trickled.length):  # (a reason may differ: what is seen first)
        raise AssertionError(f"fed whole: {a} ({whole.why}), fed a byte at a time: {b} ({trickled.why})")
    if a == P_INCOMPLETE:
        return "incomplete"
    if a == P_OTHER:
        return HANDOVER_REASONS[whole.why]
    fields = [(data[f.name:f.colon], data[f.value:f.end]) for f in whole.fields[:whole.nfields] if f.kept]
    keyed = [data[whole.key[i]:whole.key_end[i]] if whole.key[i] >= 0 else None for i in range(count)]
    return {"method": b"POST" if whole.post else b"GET", "target": data[whole.target:whole.target_end],
            "path": data[whole.target:whole.path_end], "fields": fields, "keys": keyed,
            "body": whole.body if whole.has_length else None, "length": whole.length}


def read_response_head(bytes data):
    """``parse_response`` over a whole head (through its blank line): the refusal's words, or what the relay
    reads of it (status, reason, fields but Content-Length, its value, chunked, close)."""
    cdef Response r
    cdef Py_ssize_t end = head_end(<const unsigned char*>PyBytes_AS_STRING(data), 0, len(data))
    if end != len(data):
        raise ValueError("not one whole head")
    if not parse_response(<const unsigned char*>PyBytes_AS_STRING(data), end, &r):
        return r.error.decode()
    return {"status": r.status, "reason": data[r.reason:r.reason_end],
            "fields": [(data[f.name:f.colon], data[f.value:f.end]) for f in r.fields[:r.nfields]],
            "length": data[r.content_length:r.content_length_end] if r.content_length >= 0 else None,
            "chunked": bool(r.chunked), "close": bool(r.close)}


def read_chunked(bytes data):
    """``dechunk`` over a chunked body fed a byte at a time: (the data, where the body ended or None, the refusal's
    words or None)."""
    cdef Chunks chunks
    cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t used = 0, at = 0, length = 0, end
    cdef int found
    pieces = []
    chunks_reset(&chunks)
    for end in range(1, len(data) + 1):
        while used < end:
            found = dechunk(&chunks, s, end, &used, &at, &length)
            if found == CH_DATA:
                pieces.append(data[at:at + length])
            elif found == CH_END:
                return b"".join(pieces), used, None
            elif found == CH_BAD:
                return b"".join(pieces), None, chunks.error.decode()
    return b"".join(pieces), None, None
