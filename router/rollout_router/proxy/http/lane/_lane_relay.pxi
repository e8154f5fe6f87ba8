# One answer on one replica connection (included by _lane.pyx): ``connection.relay.Exchange`` and
# ``upstream.UpstreamConnection`` for the requests the lane sends. The response head is read whole, then the
# body passes through as it comes: as it is for a Content-Length answer, re-framed as chunks otherwise; a
# small non-streaming answer of known length is held and written in one piece, so a replica that breaks off
# mid-body still gets the client a JSON 502. Whatever one read of the replica brings is written to the client
# in one write; the client's write buffer above its high-water mark pauses reading the replica.

cdef enum:
    WAITING = 0
    BUFFERING = 1
    STREAMING = 2
    DONE = 3
    # how the replica's body ends
    BY_LENGTH = 0
    BY_CHUNKS = 1
    BY_CLOSE = 2
    BUFFER_LIMIT = 1048576         # connection/relay.py BUFFER_LIMIT
    MAX_RESPONSE_HEAD = 65536      # connection/relay.py MAX_RESPONSE_HEAD
    TAIL_BYTES = 4096              # turns.py TAIL_BYTES
    DONE_TAIL = 16                 # connection/relay.py DONE_TAIL

CLIENT_CLOSED = 499
STALE_RESULT = "stale"
TIMEOUT, INVALID_RESPONSE, CLOSED = "timeout", "invalid_response", "closed"  # health/outliers.py's reasons


cdef class Upstream:
    """One keep-alive connection to a replica on the lane, and the answer it relays now, if any."""

    cdef Lane lane
    cdef Pool pool
    cdef public object transport
    cdef object _write
    cdef public bint closed
    cdef public double idle_since
    cdef Client client            # the client of the answer in progress (None: idle)
    cdef readonly int state       # WAITING, BUFFERING, STREAMING or DONE, as ``relay.Exchange.state``
    cdef int framing
    cdef Chunks chunks            # the chunked framing, as far as it is read
    cdef readonly bint paused     # reading the replica paused: the client reads slowly
    cdef bint reused, sse, chunked, until_close, done_seen, timed_out, stamp, measure, keeps
    cdef bint feeding, surplus, ending     # in ``feed``; bytes after the answer in its read; ended in ``feed``
    cdef bint ending_reusable
    cdef object ending_result
    # what ``HttpProxy.expire_silent`` reads and sets, as of ``connection.relay.Exchange``: reads since the answer began, as the
    # last sweep saw them, and the silence counted since
    cdef public long long seen, swept
    cdef public double silent
    cdef double first_at
    cdef int status
    cdef object code, failure
    cdef Buf head                 # the response head while it comes
    cdef Py_ssize_t scanned       # how far the head was looked through for its end
    cdef Buf body                 # a held answer's body (BUFFERING)
    cdef Buf out                  # what this read sends the client
    cdef Buf usage                # the answer's last TAIL_BYTES, when its turn is measured
    cdef long long remaining      # BY_LENGTH: body bytes to come
    cdef long long bare           # bytes read since the last body bytes, once the head has ended
    cdef bytes before, after      # the client's head (``heads.client_head``), its Content-Length between them
    cdef char length[24]          # the replica's Content-Length value
    cdef Py_ssize_t length_size
    cdef unsigned char tail[DONE_TAIL]
    cdef int tail_size
    cdef Response response

    def __cinit__(self, Pool pool, Lane lane):
        self.pool, self.lane = pool, lane
        self.state = DONE

    def __dealloc__(self):
        buf_free(&self.head)
        buf_free(&self.body)
        buf_free(&self.out)
        buf_free(&self.usage)

    # asyncio.Protocol
    def connection_made(self, transport):
        self.transport, self._write = transport, transport.write

    def data_received(self, data):
        if self.client is None:  # bytes nobody asked for: the connection cannot be trusted any more
            self.close()
            return
        self.feed(PyBytes_AS_STRING(data), len(data))

    def eof_received(self):
        return False  # close our side too; the answer learns in connection_lost

    def connection_lost(self, exc):
        self.closed = True
        self.pool.forget(self)
        if self.client is not None:
            self.lost(exc)

    def pause_writing(self):
        pass  # a request is written once, whole

    def resume_writing(self):
        pass

    cdef void close(self) except *:
        """Drop the connection at once (RST): the replica must notice a cancelled request right away."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # one answer
    cdef void start(self, Client client, bytes request, bint reused, bint measure) except *:
        self.client, self.reused, self.measure = client, reused, measure
        self.state, self.status, self.code, self.failure = WAITING, 0, None, None
        self.sse = self.chunked = self.until_close = self.done_seen = self.paused = self.timed_out = False
        self.keeps = self.feeding = self.surplus = self.ending = False
        self.stamp = True
        self.seen = self.swept = self.bare = self.remaining = 0
        self.silent = self.first_at = 0
        self.scanned = self.tail_size = 0
        self.head.size = self.body.size = self.out.size = self.usage.size = 0
        self.lane.active.add(self)
        self._write(request)

    cdef void feed(self, const char* s, Py_ssize_t size) except *:
        """One read of the replica: parsed to its end, and what it brings for the client written at once. An
        answer that ends in the read ends once the whole read is parsed: bytes after it make the connection
        one not to pool (``relay.Exchange.feed``)."""
        cdef int state = self.state
        cdef Py_ssize_t pieces = self.out.size + self.body.size
        self.seen += 1
        self.feeding = True
        try:
            self.consume(s, size)
        finally:
            self.feeding = False
        if self.ending:
            self.ending = False
            self.end(self.ending_reusable and not self.surplus, self.ending_result)
            return
        if self.state == WAITING:
            if self.head.size > MAX_RESPONSE_HEAD:
                self.fail(self.too_big(), INVALID_RESPONSE)
        elif state == self.state and self.out.size + self.body.size == pieces:  # no body bytes: framing, trailers
            self.bare += size
            if self.bare > MAX_RESPONSE_HEAD:
                self.fail(f"sent over {MAX_RESPONSE_HEAD} bytes after its body's last bytes (trailers)",
                          INVALID_RESPONSE)
        else:
            self.bare = 0
        self.flush()

    cdef str too_big(self):
        return f"sent a response head over {MAX_RESPONSE_HEAD} bytes or {MAX_FIELDS} header fields"

    cdef void consume(self, const char* s, Py_ssize_t size) except *:
        cdef Py_ssize_t end
        cdef bint read
        if self.state != WAITING:
            if self.body_bytes(s, size) < size:
                self.surplus = True
            return
        buf_add(&self.head, s, size)
        while self.state == WAITING:
            end = head_end(<const unsigned char*>self.head.data, self.scanned - 3 if self.scanned > 3 else 0,
                           self.head.size)
            if end < 0:
                self.scanned = self.head.size
                return
            read = self.read_head(end)
            buf_drop(&self.head, end)
            self.scanned = 0
            if not read:
                break
        if self.head.size:  # what came after the head in the same read
            if self.state == DONE or self.body_bytes(self.head.data, self.head.size) < self.head.size:
                self.surplus = True
        self.head.size = 0

    cdef bint read_head(self, Py_ssize_t end) except -1:
        """A whole response head at the start of ``head``: an interim one is relayed or dropped (False: ended
        the answer); a final one sets how the body is relayed."""
        cdef Response* r = &self.response
        if not parse_response(<const unsigned char*>self.head.data, end, r):
            if r.nfields >= MAX_FIELDS:
                self.fail(self.too_big(), INVALID_RESPONSE)
            else:
                self.fail(f"sent an invalid response ({r.error.decode()})", INVALID_RESPONSE)
            return False
        if r.status == 101:
            self.fail("answered 101 Switching Protocols, which the router does not relay", INVALID_RESPONSE)
            return False
        if r.status < 200:
            if r.status != 100:  # the body went out with the head; 103 and the like are the client's
                self.client.write(self.interim_head(r))
            return True
        self.final_head(r)
        return True

    cdef bytes interim_head(self, Response* r):
        """An informational head as the Python path relays it (``wire.status_line`` and ``heads.lines``)."""
        cdef Buf line
        cdef Field* f
        cdef int i
        cdef const char* s = self.head.data
        line.data, line.size, line.cap = NULL, 0, 0
        try:
            buf_add(&line, s, 13)  # "HTTP/1.1 1xx "
            memcpy(line.data, b"HTTP/1.1", 8)
            line.data[12] = 32
            buf_add(&line, s + r.reason, r.reason_end - r.reason)
            buf_add(&line, b"\r\n", 2)
            for i in range(r.nfields):
                f = &r.fields[i]
                buf_add(&line, s + f.name, f.colon - f.name)
                buf_add(&line, b": ", 2)
                buf_add(&line, s + f.value, f.end - f.value)
                buf_add(&line, b"\r\n", 2)
            buf_add(&line, b"\r\n", 2)
            return buf_bytes(&line)
        finally:
            buf_free(&line)

    cdef void final_head(self, Response* r) except *:
        """``Exchange.on_headers_complete``: the client's head for this shape, then hold or stream the body."""
        cdef bint has_length = r.content_length >= 0
        cdef bint no_body = r.status == 204 or r.status == 304
        cdef object built
        self.status = r.status
        # llhttp's should_keep_alive: not when the replica said close, nor when only the close ends the body
        self.keeps = not r.close and (has_length or r.chunked or no_body)
        built = self.client_head(r, has_length)
        self.before, self.after, self.sse, self.chunked, self.until_close, close_after = built
        self.length_size = 0
        if has_length:  # the value, as the replica sent it, between the two halves of the remembered head
            self.length_size = r.content_length_end - r.content_length
            if self.length_size > <Py_ssize_t>sizeof(self.length):
                self.length_size = sizeof(self.length)  # never: parse_response refuses longer values
            memcpy(self.length, self.head.data + r.content_length, self.length_size)
        if close_after:  # never for the lane's keep-alive HTTP/1.1 requests (heads.client_head)
            self.keeps = False
        if no_body:
            self.put_head()
            self.code = r.status
            self.finish(self.keeps, None)
            return
        if has_length:
            self.framing, self.remaining = BY_LENGTH, r.body
        elif r.chunked:
            self.framing = BY_CHUNKS
            chunks_reset(&self.chunks)
        else:
            self.framing = BY_CLOSE
        if has_length and r.body <= BUFFER_LIMIT and not self.sse:
            self.state = BUFFERING
        else:
            self.state = STREAMING
            self.put_head()
            if self.client.write_paused:
                self.pause()
        if has_length and r.body == 0:
            self.complete()

    cdef void put_head(self) except *:
        """The client's head into ``out``: its first half, the Content-Length line when the replica sent one, the
        rest (``heads.client_head``'s two parts)."""
        buf_add(&self.out, PyBytes_AS_STRING(self.before), PyBytes_GET_SIZE(self.before))
        if self.length_size:
            buf_add(&self.out, b"Content-Length: ", 16)
            buf_add(&self.out, self.length, self.length_size)
            buf_add(&self.out, b"\r\n", 2)
            buf_add(&self.out, PyBytes_AS_STRING(self.after), PyBytes_GET_SIZE(self.after))

    cdef object client_head(self, Response* r, bint has_length):
        """``heads.client_head`` for this head, remembered per shape: the head's bytes but for its Content-Length
        value, whether the replica keeps the connection, and the replica's weight version (``LaneGlue.head``).
        The pool's last shape is compared in place first: a replica sends the same head over and over."""
        cdef Pool pool = self.pool
        cdef const char* s = self.head.data
        cdef PyObject* found = PyDict_GetItem(self.lane.versions, pool.replica)
        cdef object version = <object>found if found != NULL else None
        cdef Py_ssize_t cut = r.content_length if has_length else r.length
        cdef Py_ssize_t resume = r.content_length_end if has_length else r.length
        cdef Py_ssize_t size = cut + (r.length - resume) + 1
        cdef char keeps = 49 if self.keeps else 48
        if version is not pool.version:
            pool.heads.clear()
            pool.last.size = 0
            pool.version = version
        if (pool.last.size == size and pool.last.data[size - 1] == keeps and memcmp(pool.last.data, s, cut) == 0
                and memcmp(pool.last.data + cut, s + resume, r.length - resume) == 0):
            return pool.last_built
        key = PyBytes_FromStringAndSize(NULL, size)
        memcpy(PyBytes_AS_STRING(key), s, cut)
        memcpy(PyBytes_AS_STRING(key) + cut, s + resume, r.length - resume)
        PyBytes_AS_STRING(key)[size - 1] = keeps
        built = pool.heads.get(key)
        if built is None:
            fields = [(PyBytes_FromStringAndSize(s + r.fields[i].name, r.fields[i].colon - r.fields[i].name),
                       PyBytes_FromStringAndSize(s + r.fields[i].value, r.fields[i].end - r.fields[i].value))
                      for i in range(r.nfields)]
            built = self.lane._head(pool.replica, r.status, PyBytes_FromStringAndSize(s + r.reason,
                                    r.reason_end - r.reason), fields, has_length, self.keeps, version)
            if len(pool.heads) >= 256:  # wire/heads.py HEADS_KEPT: a churn of Dates cannot grow it
                pool.heads.clear()
            pool.heads[key] = built
        pool.last.size = 0
        buf_add(&pool.last, PyBytes_AS_STRING(key), size)
        pool.last_built = built
        return built

    cdef Py_ssize_t body_bytes(self, const char* s, Py_ssize_t size) except -1:
        """Body bytes of the replica's framing: relayed, and the answer completed at its end; returns the bytes
        used (fewer than ``size`` when the answer ended before them)."""
        cdef Py_ssize_t used = 0, at = 0, take
        cdef int found
        if self.framing == BY_CLOSE:
            self.on_body(s, size)
            return size
        if self.framing == BY_LENGTH:
            take = size if size < self.remaining else self.remaining
            if take:
                self.on_body(s, take)
            self.remaining -= take
            if self.remaining == 0 and self.state != DONE:
                self.complete()
            return take
        while used < size and self.state != DONE:
            found = dechunk(&self.chunks, <const unsigned char*>s, size, &used, &at, &take)
            if found == CH_DATA:
                self.on_body(s + at, take)
            elif found == CH_END:
                self.complete()
            elif found == CH_BAD:
                self.fail(f"sent an invalid response ({self.chunks.error.decode()})", INVALID_RESPONSE)
                return 0
        return used

    cdef void on_body(self, const char* s, Py_ssize_t size) except *:
        """Body bytes for the client: held, or framed and sent; the stream's first byte, [DONE] and tail noted."""
        cdef char frame[24]
        cdef Py_ssize_t n, keep, i
        if self.stamp:
            self.stamp = False
            self.first_at = monotonic()  # a stream's first event, not its head
        if self.state == BUFFERING:
            buf_add(&self.body, s, size)
            return
        if self.chunked:
            n = _hex_size(size, frame)
            frame[n], frame[n + 1] = 13, 10
            buf_add(&self.out, frame, n + 2)
            buf_add(&self.out, s, size)
            buf_add(&self.out, b"\r\n", 2)
        else:
            buf_add(&self.out, s, size)
        if self.measure:
            _keep_tail(&self.usage, s, size)
        if self.sse and not self.done_seen:
            # connection/relay.py: the client has the whole answer at `data: [DONE]`; only the stream's last DONE_TAIL
            # bytes count (a piece shorter than that joins the bytes before it)
            keep = DONE_TAIL - size if size < DONE_TAIL else 0
            if keep > self.tail_size:
                keep = self.tail_size
            memmove(self.tail, self.tail + self.tail_size - keep, keep)
            n = size if size < DONE_TAIL - keep else DONE_TAIL - keep
            memcpy(self.tail + keep, s + size - n, n)
            self.tail_size = keep + n
            self.done_seen = _ends_done(self.tail, self.tail_size)

    cdef void complete(self) except *:
        """``Exchange.on_message_complete``: a held answer goes out whole; a re-framed one gets its last chunk."""
        if self.state == BUFFERING:
            self.put_head()
            buf_add(&self.out, self.body.data, self.body.size)
            if self.measure:
                self.usage.size = 0
                _keep_tail(&self.usage, self.body.data, self.body.size)
        elif self.chunked:
            buf_add(&self.out, b"0\r\n\r\n", 5)
        self.code = self.status
        self.finish(self.keeps, None)

    # endings
    cdef void lost(self, exc) except *:
        """The replica's connection closed under this answer."""
        if self.state == DONE:
            return
        if self.state == STREAMING and self.until_close and exc is None:
            self.complete()  # a body delimited by the close has ended
        elif self.seen == 0 and self.reused:
            self.finish(False, STALE_RESULT)
        else:
            self.fail(f"closed the connection ({type(exc).__name__ if exc is not None else 'EOF'})", CLOSED)
        self.flush()

    @property
    def forwarded(self):
        """Never to a fleet's owner router (``relay.Exchange.forwarded``): the lane forwards to replicas only."""
        return False

    def timeout(self):
        """The sweep found the replica silent too long (``HttpProxy.expire_silent``, as ``relay.Exchange.timeout``)."""
        self.timed_out = True
        self.fail("timed out", TIMEOUT)
        self.flush()

    cdef void client_gone(self) except *:
        """The client hung up: stop the replica's work at once; a stream read to [DONE] still counts as done."""
        if self.state == DONE:
            return
        self.out.size = 0
        self.code = self.status if self.done_seen else CLIENT_CLOSED
        self.finish(False, None)

    cdef void fail(self, str what, object reason) except *:
        """``Exchange.fail``: tell the client as well as the state of the answer allows (``LaneGlue.failed``
        counts it and makes the error's bytes; None: cut the connection)."""
        if self.state == DONE:
            return
        if self.state == WAITING:
            self.failure = reason
        answer, self.code = self.lane._failed(self.pool.replica, self.state, what, self.timed_out,
                                              self.sse and self.chunked)
        if answer is None:
            self.flush()
            self.client.abort()
        else:
            buf_add(&self.out, PyBytes_AS_STRING(answer), len(answer))
        self.finish(False, None)

    cdef void finish(self, bint reusable, object result) except *:
        """The answer is over: ended now, or, within ``feed``, once its read is parsed."""
        self.state = DONE
        if self.feeding:
            self.ending, self.ending_reusable, self.ending_result = True, reusable, result
        else:
            self.end(reusable, result)

    cdef void end(self, bint reusable, object result) except *:
        """Detach from both connections; the connection goes back to the pool if it can, the client's answer is
        written, and the client learns the end (``Client.finished``), or hands the request over when stale."""
        cdef Client client = self.client
        self.client = None
        self.lane.active.discard(self)
        if reusable and not self.closed:
            if self.paused:
                self.paused = False
                self.transport.resume_reading()
            self.pool.give_back(self, self.lane.now)
        else:
            self.close()
        if self.out.size:
            client.write(buf_bytes(&self.out))
            self.out.size = 0
        if result is not None:
            client.stale()
            return
        tail = None
        if self.usage.size and self.code is not None and self.code < 400:
            tail = buf_bytes(&self.usage)
        self.usage.size = self.body.size = 0
        if self.body.cap > KEEP_CAPACITY:
            buf_free(&self.body)
        client.finished(self.code, self.status, self.failure, self.first_at, tail)

    cdef void flush(self) except *:
        if self.out.size and self.client is not None:
            self.client.write(buf_bytes(&self.out))
            self.out.size = 0

    # back-pressure
    cdef void pause(self) except *:
        if not self.paused and self.transport is not None and self.state == STREAMING:
            self.paused = True
            self.transport.pause_reading()

    cdef void resume(self) except *:
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()


cdef Py_ssize_t _hex_size(Py_ssize_t value, char* out) noexcept:
    """``value`` in lower-case hex (as ``b"%x"``) into ``out``; returns the digits written."""
    cdef char digits[20]
    cdef Py_ssize_t n = 0, i
    if value == 0:
        out[0] = 48
        return 1
    while value > 0:
        digits[n] = b"0123456789abcdef"[value & 15]
        value >>= 4
        n += 1
    for i in range(n):
        out[i] = digits[n - 1 - i]
    return n


cdef int _keep_tail(Buf* tail, const char* s, Py_ssize_t size) except -1:
    """Keep the last TAIL_BYTES of what ``tail`` held and ``s[:size]``."""
    cdef Py_ssize_t drop
    if size >= TAIL_BYTES:
        tail.size = 0
        return buf_add(tail, s + size - TAIL_BYTES, TAIL_BYTES)
    drop = tail.size + size - TAIL_BYTES
    if drop > 0:
        buf_drop(tail, drop)
    return buf_add(tail, s, size)


cdef bint _ends_done(const unsigned char* tail, Py_ssize_t size) noexcept:
    """Whether the stream's last bytes, trailing whitespace stripped, end with ``data: [DONE]``."""
    while size and tail[size - 1] in b" \t\n\r\x0b\x0c":
        size -= 1
    return size >= 12 and memcmp(tail + size - 12, b"data: [DONE]", 12) == 0
