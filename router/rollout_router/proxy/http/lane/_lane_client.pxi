# A client connection on the lane (included by _lane.pyx): ``connection.client.ClientConnection`` for the requests the
# lane takes, one at a time in arrival order; pipelined requests wait in the buffer, and reading pauses while
# more than PAUSE_AT bytes wait. Every byte held counts against the listener's budget until its request is
# answered or handed over.

cdef class Client:
    """One client connection while the lane serves it (``asyncio.Protocol``, as uvloop calls it)."""

    cdef Lane lane
    cdef public object transport
    cdef object _write
    cdef Buf buf                  # bytes read and not answered yet, from the current request's first on
    cdef Head head                # the current request's head, as far as it is read
    cdef long long charged        # budget bytes counted for ``buf``
    cdef Py_ssize_t size          # the current request's bytes (head and body), once whole
    cdef public bint gone, write_paused
    cdef bint busy, handed, broken, read_paused, measure
    cdef public int shaped        # handovers for the request's shape so far (carried over by the glue)
    cdef double write_paused_at, active_at
    cdef public double since      # when the current request's first byte came (0: none pending)
    cdef public double body_since  # when its head ended and its body began (0: not yet)
    cdef Upstream upstream        # the connection its answer comes from
    cdef Pool pool
    cdef object token             # what ``route`` returned for it, handed to ``finish``

    def __cinit__(self, Lane lane):
        self.lane = lane
        head_reset(&self.head)

    def __dealloc__(self):
        buf_free(&self.buf)

    # asyncio.Protocol
    def connection_made(self, transport):
        self.transport, self._write = transport, transport.write
        transport.set_write_buffer_limits(high=self.lane.write_high_water)
        self.active_at = self.since = self.lane.now or 1e-9  # a new connection owes its first head as any other
        if not self.lane._opened(self):
            self.hand_over(W_ADMIT, None)

    def close_if_idle(self, double idle_before):
        """Stopping: close the connection if nothing has happened on it since ``idle_before`` (the sweep's clock)
        and no request is being read or answered here (that one closes it after its answer, or goes to the Python
        path, which does)."""
        if not (self.busy or self.buf.size or self.handed or self.gone or self.broken) and self.active_at < idle_before:
            self.transport.close()

    def adopt(self, transport, double active_at):
        """Take over ``transport`` from the Python path, idle (``LaneGlue.take_back``)."""
        self.transport, self._write = transport, transport.write
        self.active_at = active_at

    def data_received(self, data):
        cdef Py_ssize_t size = len(data)
        if self.handed or self.gone or self.broken:
            return
        self.active_at = self.lane.now
        buf_add(&self.buf, PyBytes_AS_STRING(data), size)
        if not self.lane.charge(size):
            self.hand_over(W_BUDGET, None)
            return
        self.charged += size
        if not self.busy:
            self.next()
        elif self.buf.size > PAUSE_AT and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def eof_received(self):
        return False  # a client's FIN means it is gone (connection/client.py): what it waits for is cancelled

    def connection_lost(self, exc):
        self.gone = True
        if self.upstream is not None:
            self.upstream.client_gone()
        self.release(self.charged)
        buf_free(&self.buf)
        if not self.handed:
            self.lane._closed(self)

    def pause_writing(self):
        self.write_paused = True
        self.write_paused_at = self.lane.now
        if self.upstream is not None:
            self.upstream.pause()

    def resume_writing(self):
        self.write_paused = False
        if self.upstream is not None:
            self.upstream.resume()
        self.next()

    def check(self, double now, limits):
        """The sweep's visit (``ClientConnection.check``): an idle connection closes, a stalled one is cut, and
        a request still arriving goes to the Python path, which times heads and bodies."""
        if self.gone or self.handed or self.broken:
            return None
        if self.write_paused and now - self.write_paused_at > self.lane.write_stall_seconds:
            self.lane.listener.write_stalls.inc()
            self.abort()
        elif not self.busy and self.since:
            return self.hand_over(W_SLOW, None)
        elif not self.busy and now - self.active_at > self.lane.idle_seconds:
            self.transport.close()
        return None

    @property
    def exchange(self):
        """The answer in progress (``ClientConnection.exchange``), if any."""
        return self.upstream

    @property
    def _read_paused(self):
        """Whether reading is paused (``ClientConnection._read_paused``): too many bytes wait behind an answer."""
        return self.read_paused

    # the requests
    cdef void next(self) except *:
        """Start the next whole request in the buffer, if nothing is being answered."""
        cdef int parsed
        cdef Lane lane = self.lane
        if self.write_paused and self.buf.size and not (self.busy or self.gone or self.handed or self.broken):
            self.hand_over(W_BACKLOG, None)  # requests wait while the client reads none of its answers: the Python
            return  # path queues them, and pauses reading when too many wait
        while not (self.busy or self.gone or self.handed or self.broken or self.write_paused) and self.buf.size:
            if not self.since:
                self.since = lane.now or 1e-9
            if self.head.length == 0:
                if lane.count < 0:
                    self.hand_over(W_ROUTE, None)
                    return
                parsed = parse_request(<const unsigned char*>self.buf.data, self.buf.size, &self.head,
                                       lane.names, lane.sizes, lane.count)
                if parsed == P_INCOMPLETE:
                    return
                if parsed == P_OTHER:
                    self.hand_over(self.head.why, None)
                    return
                if self.head.body > lane.max_body:
                    self.hand_over(W_BODY, None)
                    return
                self.body_since = lane.now or 1e-9
            self.size = self.head.length + self.head.body
            if self.buf.size < self.size:
                return
            self.dispatch()

    cdef void dispatch(self) except *:
        """Route the whole request (``LaneGlue.route``), then send it on an idle connection or a new one."""
        cdef Lane lane = self.lane
        cdef Head* h = &self.head
        cdef int index
        cdef object key = None, group = None
        cdef int key_at = -1, group_at = -1
        for index in range(lane.count):
            if h.key[index] >= 0 and h.key_end[index] > h.key[index]:
                if index < lane.session_count:
                    if key is None:
                        key, key_at = PyBytes_FromStringAndSize(self.buf.data + h.key[index],
                                                                h.key_end[index] - h.key[index]), index
                elif group is None:
                    group, group_at = PyBytes_FromStringAndSize(self.buf.data + h.key[index],
                                                                h.key_end[index] - h.key[index]), index
        path = PyBytes_FromStringAndSize(self.buf.data + h.target, h.path_end - h.target)
        if group_at >= 0:
            group_at -= lane.session_count
        routed = lane.route(self, path, h.body, key_at, key, group_at, group, monotonic())
        if routed is None:
            self.hand_over(W_ROUTE, None)
            return
        self.busy, self.since, self.body_since = True, 0, 0
        if routed:
            self.routed(routed[0], routed[1], routed[2])  # (cpdef: a C call here)
        # else asked of the sibling worker that owns its key: ``routed`` or ``relay`` comes when it answers

    cpdef routed(self, Pool pool, bint measure, token):
        """Send the request routed to ``pool``'s replica on an idle connection, or a new one; ``token`` is what
        ``finish`` gets (``LaneGlue.route``, or ``LaneAsked`` for a request a sibling worker routed)."""
        self.pool, self.measure, self.token = pool, measure, token
        up = self.pool.take()
        if up is None:
            self.lane._connect(self.pool, self)
        else:
            self.send(up, True)

    def relay(self):
        """The sibling worker asked would not route the request: the Python path relays it through its owner."""
        self.busy = False
        self.hand_over(W_ROUTE, RELAY)

    def connected(self, Upstream up):
        """The new connection ``LaneGlue.connect`` opened for the request waiting here."""
        if self.gone:
            up.close()
            self.finished(499, 0, None, 0.0, None)
            return
        self.send(up, False)

    cdef void send(self, Upstream up, bint reused) except *:
        """The request as the replica gets it (``relay.request_bytes``): its head minus hop-by-hop fields,
        the replica's Host and path prefix, the same body."""
        cdef Head* h = &self.head
        cdef Pool pool = self.pool
        cdef const char* s = self.buf.data
        cdef Py_ssize_t size, i, digits = 0
        cdef long long body = h.body
        cdef char length[24]
        cdef char* out
        cdef Field* f
        cdef bint with_length = body > 0 or h.post
        if with_length:
            digits = _decimal(body, length)
        size = (5 if h.post else 4) + len(pool.prefix) + (h.target_end - h.target) + 11 + 6 + len(pool.host_header) + 2
        for i in range(h.nfields):
            f = &h.fields[i]
            if f.kept:
                size += (f.colon - f.name) + 2 + (f.end - f.value) + 2
        if with_length:
            size += 16 + digits + 2
        size += 2 + body
        data = PyBytes_FromStringAndSize(NULL, size)
        out = PyBytes_AS_STRING(data)
        out = _put(out, b"POST " if h.post else b"GET ", 5 if h.post else 4)
        out = _put(out, PyBytes_AS_STRING(pool.prefix), len(pool.prefix))
        out = _put(out, s + h.target, h.target_end - h.target)
        out = _put(out, b" HTTP/1.1\r\nHost: ", 17)
        out = _put(out, PyBytes_AS_STRING(pool.host_header), len(pool.host_header))
        out = _put(out, b"\r\n", 2)
        for i in range(h.nfields):
            f = &h.fields[i]
            if f.kept:
                out = _put(out, s + f.name, f.colon - f.name)
                out = _put(out, b": ", 2)
                out = _put(out, s + f.value, f.end - f.value)
                out = _put(out, b"\r\n", 2)
        if with_length:
            out = _put(out, b"Content-Length: ", 16)
            out = _put(out, length, digits)
            out = _put(out, b"\r\n", 2)
        out = _put(out, b"\r\n", 2)
        _put(out, s + h.length, body)
        self.upstream = up
        up.start(self, data, reused, self.measure)

    cdef void finished(self, object code, int status, object failure, double first_at, object tail) except *:
        """The answer has ended: recorded (``LaneGlue.finish``), its bytes leave the budget, and the next request
        starts."""
        token, self.token = self.token, None
        self.upstream, self.pool = None, None
        self.lane.forwarded += 1
        try:
            self.lane.finish(token, code, status, failure, first_at, tail, monotonic())
        except BaseException as error:
            self.lane.report(error)
        self.answered()

    cdef void answered(self) except *:
        self.busy = False
        self.active_at = self.lane.now
        self.release(self.size)
        buf_drop(&self.buf, self.size)
        self.size = 0
        head_reset(&self.head)
        if self.gone or self.handed or self.broken:
            return
        if self.read_paused and self.buf.size <= PAUSE_AT // 2:
            self.read_paused = False
            self.transport.resume_reading()
        self.next()

    cdef void stale(self) except *:
        """The pooled connection closed before answering: sent again, once, on a new one (``ReplicaPool.exchange``:
        a new connection is never stale; nothing was sent, and the attempt's clock runs on)."""
        self.upstream = None
        self.lane._connect(self.pool, self)

    def refused(self, error):
        """Connecting failed (``LaneGlue.connect``): the Python path counts it and retries elsewhere."""
        token, self.token = self.token, None
        self.pool, self.busy = None, False
        if self.gone:
            self.lane.glue.abandon(token, error)
            return
        self.hand_over(W_REFUSED, (token, error))

    cdef object hand_over(self, int why, object handed):
        """Give the connection to the Python path: the bytes held from the current request on (uncounted
        here first: the Python path counts them as it reads them), the routing when the request was routed
        (``handed``: its token, and a connect error); returns what ``LaneGlue.hand_over`` does."""
        cdef bytes data = buf_bytes(&self.buf)
        self.lane.handovers[why] += 1
        self.release(self.charged)
        buf_free(&self.buf)
        self.handed = True
        if why < W_BODY:
            self.shaped += 1
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        return self.lane._hand_over(self, data, why, handed)

    cdef void release(self, long long size) except *:
        """``size`` bytes held here leave the budget (at most what is counted: a request answered after its
        connection was lost, which released everything, releases nothing)."""
        if size > self.charged:
            size = self.charged
        self.lane.uncharge(size)
        self.charged -= size

    # what the relay calls
    cdef void write(self, bytes data) except *:
        if not self.gone:
            self._write(data)

    def abort(self):
        """Cut the connection: the only way to tell a client that an answer of known length broke off."""
        self.broken = True
        if self.transport is not None:
            self.transport.abort()


cdef inline char* _put(char* out, const char* s, Py_ssize_t n) noexcept:
    memcpy(out, s, n)
    return out + n


cdef Py_ssize_t _decimal(long long value, char* out) noexcept:
    """``value`` (>= 0) in decimal into ``out``; returns the digits written."""
    cdef char digits[24]
    cdef Py_ssize_t n = 0, i
    if value == 0:
        out[0] = 48
        return 1
    while value > 0:
        digits[n] = 48 + value % 10
        value //= 10
        n += 1
    for i in range(n):
        out[i] = digits[n - 1 - i]
    return n
