# cython: language_level=3, boundscheck=False, wraparound=False
"""The gRPC relay's frame engine in C: what h2.py's ``split_frames`` and ``frame`` do, per frame relayed.

Every relayed message is a frame parsed from a connection's buffer and a frame built for the other side; in
Python each costs a few microseconds of interpreter work (docs/benchmarks.md, "Where our CPU per call goes").
These are pure functions of their arguments (no Python state read but what is passed in), so h2.py keeps their
pure-Python reference, which runs where this module is not built and which tests compare this one with.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.string cimport memcpy

from time import monotonic

from hpack import HPACKError
from hpack.huffman_table import HUFFMAN_TABLE
from hpack.table import HeaderTable

cdef enum:
    FRAME_SIZE = 16384  # h2.FRAME_SIZE: what we advertise, so a longer frame is the peer's error
    HEADERS = 1
    CONTINUATION = 9

SOURCE_HASH = GRPC_FRAMES_SOURCE_HASH  # the sources it was built from (h2.py refuses a stale build)


cpdef tuple split_frames(bytearray buffer, Py_ssize_t limit, Py_ssize_t head_work=1):
    """h2.split_frames: the complete frames at the start of ``buffer`` worth at most ``limit`` units of work."""
    cdef list frames = []
    cdef Py_ssize_t offset = 0, size = PyByteArray_GET_SIZE(buffer), work = 0, length, end
    cdef const unsigned char* data = <const unsigned char*> PyByteArray_AS_STRING(buffer)
    cdef int kind, flags
    cdef unsigned int stream_id
    while size - offset >= 9:
        if work >= limit:
            return frames, offset, True
        length = (<Py_ssize_t> data[offset] << 16) | (<Py_ssize_t> data[offset + 1] << 8) | data[offset + 2]
        if length > FRAME_SIZE:
            frames.append((-1, 0, 0, b""))
            return frames, size, False
        end = offset + 9 + length
        if end > size:
            break
        kind = data[offset + 3]
        flags = data[offset + 4]
        stream_id = ((<unsigned int> data[offset + 5] & 0x7F) << 24) | (<unsigned int> data[offset + 6] << 16) | \
            (<unsigned int> data[offset + 7] << 8) | data[offset + 8]
        work += head_work if kind == HEADERS or kind == CONTINUATION else 1
        frames.append((kind, flags, stream_id,
                       PyBytes_FromStringAndSize(<const char*> data + offset + 9, length)))
        offset = end
    return frames, offset, False


cpdef bytes frame(int kind, int flags, unsigned int stream_id, object payload=b""):
    """h2.frame: the 9-byte head, then the payload (bytes-like), in one allocation and one copy."""
    cdef const unsigned char[::1] view
    cdef Py_ssize_t length = len(payload)
    if length > 0xFFFFFF or not 0 <= kind <= 0xFF or not 0 <= flags <= 0xFF:
        raise ValueError(f"no frame of type {kind}, flags {flags} and {length} bytes")
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 9 + length)
    cdef unsigned char* head = <unsigned char*> PyBytes_AS_STRING(out)
    head[0], head[1], head[2], head[3] = (length >> 16) & 0xFF, (length >> 8) & 0xFF, length & 0xFF, kind
    head[4] = flags
    head[5], head[6], head[7], head[8] = (stream_id >> 24) & 0xFF, (stream_id >> 16) & 0xFF, (stream_id >> 8) & 0xFF, \
        stream_id & 0xFF
    if length:
        view = payload
        memcpy(head + 9, &view[0], length)
    return out


# The relay: what conn.H2Connection._work does with a read, with the two frames a call's answer is made of handled
# here whole (a replica stream's DATA passed to its client stream, a WINDOW_UPDATE), a DATA frame it does not relay
# handed to the connection's ``data_frame`` (``on_frame``'s first branch) and every other frame to ``on_frame``. What
# is handled here is exactly what the Python methods would have done (conn.H2Connection.data_frame, call.Call.on_data
# and on_written, outbound.H2Output.send_data, _push, emit and consume, conn.H2Connection._window_update), and only
# when none of their other branches could be taken; anything else (a stream's first message, an end, padding, a window
# too small, a stream not found, a frame that is the peer's error) goes to Python. A HEADERS frame that is a whole
# header block, unpadded and without priority, is decoded and handed to the connection's ``headers_frame`` here
# (``_header_block``), as conn.H2Connection.header_block does with what on_frame and _headers would pass it, but for a
# relayed call's response head and trailers, passed to its client's stream here (``_relay_head``) with one Python call
# each (the head's added fields, the call's end). h2.py_work is the reference: the same loop with every frame given to
# ``on_frame``.
cdef enum:
    DATA = 0
    WINDOW_UPDATE = 8
    END_STREAM = 0x1
    END_HEADERS = 0x4
    PADDED = 0x8
    PRIORITY_FLAG = 0x20
    MAX_WINDOW = 0x7FFFFFFF
    COMPRESSION_ERROR = 0x9
    GRPC_UNKNOWN = 2  # h2.UNKNOWN: a grpc-status that is not a number

CONNECTION_HALF = 8 << 20  # conn.CONNECTION_WINDOW // 2: the connection's window is returned in halves of it
cdef Py_ssize_t _CONNECTION_HALF = CONNECTION_HALF


cdef class Stream:
    """outbound.Stream in C (its pure-Python reference, which runs without the engine): one stream as its
    connection sees it, its fields read and written here without the C API's attribute lookups."""

    def __init__(self, stream_id, owner, conn):
        self.id, self.owner, self.conn = stream_id, owner, conn
        self.window = (<ConnFields> conn).peer_window if isinstance(conn, ConnFields) else conn.peer_window
        self.pending = None
        self.unacked = 0
        self.closing = None
        self.ended = False
        self.expected = None
        self.got = 0


cdef class ConnFields:
    """The fields of a connection the relay reads and writes (outbound.H2Output's base where the engine runs;
    outbound.PyConnFields is the reference, a class with the same slots): read and written here without the C
    API's attribute lookups. The engine reads only connections of this class (the reference's run on h2.py's)."""

    def data_received(self, data):
        """conn.H2Connection.data_received (the reference) in C, with the constants ``reading_with`` was given:
        a client's connection preface first (``preface_received``, while ``preface`` is not None); the read
        appended to ``buffer`` and handled (``read``); frames left for the next turn, or reading paused until now,
        go to ``yield_turn``; with ``head_clock``, a head left incomplete starts its clock (``head_begun``). No
        Python frame per read but of a preface or a head begun."""
        cdef bytearray buffer
        if self.preface is not None:
            data = self.preface_received(data)
            if data is None:
                return
        buffer = self.buffer
        buffer += data
        more = read(self, buffer, _read_limit, self.guard.head_work, _read_dirty, _read_flag, _read_relay)
        if more or self.yielding:
            self.yield_turn(more)
        if self.head_clock:
            if self.continuing is None and (len(buffer) < 4 or buffer[3] != HEADERS and buffer[3] != CONTINUATION):
                self.head_since = None  # (most reads: every frame handled, the buffer empty)
            elif self.head_since is None:
                self.head_begun()


cdef class CallFields:
    """The fields of a call the relay reads and writes (call.Call's base where the engine runs; call.PyCallFields
    is the reference, a class with the same slots): read and written here without the C API's attribute
    lookups. A call of another class is left to Python."""


cdef inline bytes _framed(int kind, int flags, unsigned int stream_id, const unsigned char* payload,
                          Py_ssize_t length):
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 9 + length)
    cdef unsigned char* head = <unsigned char*> PyBytes_AS_STRING(out)
    head[0], head[1], head[2], head[3] = (length >> 16) & 0xFF, (length >> 8) & 0xFF, length & 0xFF, kind
    head[4] = flags
    head[5], head[6], head[7], head[8] = (stream_id >> 24) & 0xFF, (stream_id >> 16) & 0xFF, (stream_id >> 8) & 0xFF, \
        stream_id & 0xFF
    if length:
        memcpy(head + 9, payload, length)
    return out


cdef bint _relay_data(ConnFields conn, int flags, unsigned int stream_id, const unsigned char* payload,
                      Py_ssize_t length, list dirty, type relay) except -1:
    """A replica stream's DATA frame passed to its client's stream (True), or nothing done (False: Python's turn)."""
    if flags & (END_STREAM | PADDED) or length == 0:
        return False
    found = (<dict> conn.streams).get(stream_id)
    if type(found) is not Stream:  # unknown (or a stream of the reference's class: Python's turn)
        return False
    cdef Stream stream = <Stream> found
    if stream.ended or stream.expected is not None:
        return False
    call = stream.owner
    if type(call) is not relay or not isinstance(call, CallFields):
        return False
    cdef CallFields typed = <CallFields> call
    client, answer, turn, last = typed.client, typed.stream, typed.turn, typed.last
    if typed.ustream is not stream or typed.upstream is not conn or type(answer) is not Stream \
            or not isinstance(client, ConnFields):
        return False
    cdef Stream out = <Stream> answer
    if out.owner is not call or out.pending is not None:
        return False
    cdef ConnFields to = <ConnFields> client
    if to.write_paused or to.closed:
        return False
    cdef Py_ssize_t stream_window = out.window, window = to.window, unacked = conn.unacked + length, half
    if length > stream_window or length > window or unacked >= _CONNECTION_HALF:
        return False
    # conn.H2Connection.data_frame: the connection's window (returned in halves, never here: checked above), the
    # empty-frame guard (not empty), the stream's count
    conn.unacked = unacked
    conn.guard.empty = 0
    half = conn.stream_window // 2
    stream.got += length
    # call.Call.on_data: the replica's message; ``backlog`` grows by ``length`` and shrinks by it in on_written below
    if turn is not None:
        if turn.first_byte is None:
            turn.first(monotonic())  # the first response message (a stream's first tokens)
    elif not typed.first:
        typed.first_at = monotonic()  # a kept turn with no ``Turn`` (unmeasured): its first message's time alone
    typed.first = True
    typed.relayed = True
    typed.heard += 1
    if last is not None:
        last.feed(PyBytes_FromStringAndSize(<const char*> payload, length))
    # outbound: send_data, _push and emit (within a read: written by flush_dirty)
    cdef list pending = to.out
    if not pending:
        dirty.append(to)
    pending.append(_framed(DATA, 0, <unsigned int> out.id, payload, length))
    out.window = stream_window - length
    to.window = window - length
    # call.Call.on_written: the client's connection took the bytes, so the replica may send more (consume)
    cdef Py_ssize_t returned = stream.unacked + length
    cdef unsigned char increment[4]
    if returned >= half:
        increment[0], increment[1], increment[2], increment[3] = (returned >> 24) & 0xFF, (returned >> 16) & 0xFF, \
            (returned >> 8) & 0xFF, returned & 0xFF
        conn.emit(_framed(WINDOW_UPDATE, 0, stream_id, increment, 4))
        returned = 0
    stream.unacked = returned
    return True


cdef bint _window_update(ConnFields conn, unsigned int stream_id, const unsigned char* payload) except -1:
    """conn.H2Connection._window_update when the increment is valid and the stream known (True), else False."""
    cdef Py_ssize_t increment = ((<Py_ssize_t> payload[0] & 0x7F) << 24) | (<Py_ssize_t> payload[1] << 16) | \
        (<Py_ssize_t> payload[2] << 8) | payload[3]
    cdef Py_ssize_t window
    if increment == 0:
        return False
    if stream_id == 0:
        if conn.window + increment > MAX_WINDOW:
            return False
        conn.window += increment
    else:
        found = (<dict> conn.streams).get(stream_id)
        if found is None:
            return False
        if type(found) is Stream:
            window = (<Stream> found).window
            if window + increment > MAX_WINDOW:
                return False
            (<Stream> found).window = window + increment
        else:
            window = found.window
            if window + increment > MAX_WINDOW:
                return False
            found.window = window + increment
    if conn.blocked:
        conn.drain()
    return True


cdef int _header_block(ConnFields conn, unsigned int stream_id, int flags, bytes block, list dirty,
                       type relay) except -1:
    """conn.H2Connection.header_block (the reference) for a plain whole block: decoded with the connection's
    decoder, counted against its decoded-header budget (``guard.headers``), handed to its ``headers_frame`` (or,
    a relayed call's response head or trailers, passed on here: ``_relay_head``); a block that does not decode
    closes the connection (COMPRESSION_ERROR), as a spent budget does."""
    try:
        headers, size = conn.decoder.decode(block)
    except (HPACKError, IndexError, ValueError) as error:
        conn.fail(COMPRESSION_ERROR, f"bad header block ({error or type(error).__name__})", stream_id)
        return 0
    if not conn.guard.headers.take(size):
        conn.header_flood()
        return 0
    if _relay_head(conn, stream_id, headers, flags & END_STREAM, dirty, relay):
        return 0
    conn.headers_frame(stream_id, headers, bool(flags & END_STREAM))
    return 0


cdef object _grpc_status(list headers):
    """h2.grpc_status: the first grpc-status field's number (UNKNOWN if it is none), None without one."""
    for header in headers:
        if (<tuple> header)[0] == b"grpc-status":
            try:
                return int((<tuple> header)[1])
            except ValueError:
                return GRPC_UNKNOWN
    return None


cdef bint _relay_head(ConnFields conn, unsigned int stream_id, list headers, bint end, list dirty,
                      type relay) except -1:
    """A replica's response head or its trailers passed to the client's stream of the call relaying it (True), or
    nothing done (False: Python's turn): what conn.H2Connection.headers_frame, call.Call.on_headers and
    outbound.send_headers do with them, with one Python call each: the first head gets the fields the router adds
    (``Call.answering``: the replica, its weights), the trailers end the call (``Call.complete``: the streams
    closed, the attempt's outcome recorded through the shared core). A call's other heads (a second head, trailers
    with no head before them) go to Python."""
    found = (<dict> conn.streams).get(stream_id)
    if type(found) is not Stream or _read_hop is None:
        return False
    cdef Stream stream = <Stream> found
    call = stream.owner
    if stream.closing is not None or type(call) is not relay or not isinstance(call, CallFields):
        return False
    cdef CallFields typed = <CallFields> call
    client, answer = typed.client, typed.stream
    if typed.ustream is not stream or typed.upstream is not conn or typed.finished or typed.answered != end:
        return False  # (answered: trailers come now; not yet: the first head does)
    if type(answer) is not Stream or not isinstance(client, ConnFields) or (<Stream> answer).pending is not None:
        return False
    cdef list out = [header for header in headers if (<tuple> header)[0] not in _read_hop]
    typed.heard += 1
    if end:
        stream.ended = True  # conn.H2Connection.headers_frame: the replica's side ended (not finished by us: kept)
        typed.first = True
        typed.code = _grpc_status(headers)
    else:
        out += call.answering()
    _send_head(<ConnFields> client, <Stream> answer, out, end, dirty)
    if end:
        call.complete()
    return True


cdef int _send_head(ConnFields to, Stream answer, list headers, bint end, list dirty) except -1:
    """outbound.H2Output.send_headers and emit (within a read: written by flush_dirty) for a stream with nothing
    waiting; a block larger than a frame is left to send_headers (its CONTINUATION frames)."""
    cdef bytes block = encode(headers)
    if len(block) > FRAME_SIZE:
        to.send_headers(answer, headers, end)
    elif not to.closed:
        if not to.out:
            dirty.append(to)
        (<list> to.out).append(_framed(HEADERS, END_HEADERS | END_STREAM if end else END_HEADERS,
                                       <unsigned int> answer.id, <const unsigned char*> PyBytes_AS_STRING(block),
                                       len(block)))
    return 0


cpdef bint work(ConnFields conn, bytearray buffer, Py_ssize_t limit, Py_ssize_t head_work, list dirty, type relay):
    """h2.py_work: handle the complete frames at the start of ``buffer`` worth at most ``limit`` units of work,
    removing them from it; whether the limit was what stopped it. Called within a read (outbound.begin_read). Only
    for a connection with the engine's fields (H2Output where the engine runs): the reference's run on py_work."""
    cdef Py_ssize_t offset = 0, size, work = 0, length, end
    cdef const unsigned char* data
    cdef int kind, flags
    cdef unsigned int stream_id
    cdef bint more = False, dropping = False, plain
    on_frame = None  # conn.on_frame, looked up when a frame first needs it (most reads relay DATA alone)
    try:
        while True:
            # frames after one that closed it are consumed, not handled
            dropping = dropping or conn.closed
            size = PyByteArray_GET_SIZE(buffer)  # (read again after each call into Python)
            if size - offset < 9:
                break
            if work >= limit:
                more = not dropping
                break
            data = <const unsigned char*> PyByteArray_AS_STRING(buffer) + offset
            length = (<Py_ssize_t> data[0] << 16) | (<Py_ssize_t> data[1] << 8) | data[2]
            if length > FRAME_SIZE:
                offset = size
                if not dropping:
                    conn.on_frame(-1, 0, 0, b"")
                break
            end = offset + 9 + length
            if end > size:
                break
            kind = data[3]
            flags = data[4]
            stream_id = ((<unsigned int> data[5] & 0x7F) << 24) | (<unsigned int> data[6] << 16) | \
                (<unsigned int> data[7] << 8) | data[8]
            work += head_work if kind == HEADERS or kind == CONTINUATION else 1
            offset = end
            if dropping:
                continue
            plain = conn.continuing is None  # no block continued
            if kind == DATA and stream_id and plain:
                if not _relay_data(conn, flags, stream_id, data + 9, length, dirty, relay):
                    conn.data_frame(flags, stream_id, PyBytes_FromStringAndSize(<const char*> data + 9, length))
                continue
            elif kind == WINDOW_UPDATE and length == 4 and plain:
                if _window_update(conn, stream_id, data + 9):
                    continue
            elif kind == HEADERS and stream_id and flags & END_HEADERS and not flags & (PADDED | PRIORITY_FLAG) \
                    and plain:  # a whole header block: conn.H2Connection._headers' plain case
                _header_block(conn, stream_id, flags, PyBytes_FromStringAndSize(<const char*> data + 9, length),
                              dirty, relay)
                continue
            if on_frame is None:
                on_frame = conn.on_frame
            on_frame(kind, flags, stream_id, PyBytes_FromStringAndSize(<const char*> data + 9, length))
    finally:
        del buffer[:offset]
    return more


cdef Py_ssize_t _read_limit = 0
cdef list _read_dirty = None, _read_flag = None
cdef type _read_relay = None
cdef frozenset _read_hop = None  # the fields a hop never relays (call.py's); None: trailers are left to Python


cpdef reading_with(Py_ssize_t limit, list dirty, list reading, type relay, frozenset hop):
    """What ``ConnFields.data_received`` passes to ``read`` (conn.py's: FRAMES_PER_TURN, outbound's DIRTY and
    READING, the Call class) and the fields a relayed call's trailers lose (call.py's), given once at import."""
    global _read_limit, _read_dirty, _read_flag, _read_relay, _read_hop
    _read_limit, _read_dirty, _read_flag, _read_relay, _read_hop = limit, dirty, reading, relay, hop


cpdef bint read(ConnFields conn, bytearray buffer, Py_ssize_t limit, Py_ssize_t head_work, list dirty, list reading,
                type relay):
    """h2.py_read: one read handled (``work``, with ``reading[0]`` set, as outbound.begin_read does), then what it
    produced written, one write per connection (outbound.flush_dirty, H2Output.flush); whether frames are left
    for the next turn (the limit stopped it and ``conn`` is still open)."""
    cdef bint more = False
    cdef list out
    cdef ConnFields written
    reading[0] = True
    try:
        more = work(conn, buffer, limit, head_work, dirty, relay)
    finally:
        reading[0] = False
        while dirty:
            written = <ConnFields?> dirty.pop()  # (H2Output.emit and the relay put only connections there)
            out = written.out
            if out and not written.closed and written.transport is not None:
                written.transport.write(out[0] if len(out) == 1 else b"".join(out))
            del out[:]
    return more and not conn.closed



# HPACK (RFC 7541) decoding: what hpack.Decoder(max_header_list_size).decode(block, raw=True) returns, raises (as a
# HeaderBlockError, a ValueError, where it raises an HPACKError) and leaves in its dynamic table, in C. Huffman
# strings are decoded by hpack's own state machine (its table of 4-bit transitions, read here at import); the static
# table is hpack's. blocks.BlockDecoder (hpack behind a memo) is the reference, and what runs without this module.
cdef enum:
    HUFFMAN_COMPLETE = 1
    HUFFMAN_EMIT_SYMBOL = 2
    HUFFMAN_FAIL = 4
    VARINT_MAX_LENGTH = 5  # hpack's bound on an integer's bytes
    DEFAULT_TABLE_SIZE = 4096  # SETTINGS_HEADER_TABLE_SIZE: we never announce another

cdef unsigned char _huffman_state[4096]
cdef unsigned char _huffman_flags[4096]
cdef unsigned char _huffman_symbol[4096]
for _index, (_state, _flags, _symbol) in enumerate(HUFFMAN_TABLE):
    _huffman_state[_index], _huffman_flags[_index], _huffman_symbol[_index] = _state, _flags, _symbol
cdef tuple _STATIC = tuple((bytes(name), bytes(value)) for name, value in HeaderTable.STATIC_TABLE)
cdef Py_ssize_t _STATIC_LENGTH = len(_STATIC)


class HeaderBlockError(ValueError):
    """A header block hpack would refuse (its HPACKDecodingError and the errors derived from it)."""


cdef bytes _huffman(const unsigned char* data, Py_ssize_t length):
    """hpack.huffman.decode_huffman: the nibble state machine, failing where it fails."""
    if length == 0:
        return b""
    cdef unsigned char* out = <unsigned char*> PyMem_Malloc(length * 2)  # a symbol is 5 bits at least
    cdef Py_ssize_t i, count = 0
    cdef unsigned int state = 0, flags = 0, index
    if out == NULL:
        raise MemoryError()
    try:
        for i in range(length):
            index = state * 16 + (data[i] >> 4)
            state, flags = _huffman_state[index], _huffman_flags[index]
            if flags & HUFFMAN_FAIL:
                raise HeaderBlockError("Invalid Huffman string")
            if flags & HUFFMAN_EMIT_SYMBOL:
                out[count] = _huffman_symbol[index]
                count += 1
            index = state * 16 + (data[i] & 0x0F)
            state, flags = _huffman_state[index], _huffman_flags[index]
            if flags & HUFFMAN_FAIL:
                raise HeaderBlockError("Invalid Huffman string")
            if flags & HUFFMAN_EMIT_SYMBOL:
                out[count] = _huffman_symbol[index]
                count += 1
        if not flags & HUFFMAN_COMPLETE:
            raise HeaderBlockError("Incomplete Huffman string")
        return PyBytes_FromStringAndSize(<const char*> out, count)
    finally:
        PyMem_Free(out)


cdef Py_ssize_t _integer(const unsigned char* data, Py_ssize_t size, Py_ssize_t at, int prefix_bits,
                         long long* number) except -1:
    """hpack.decode_integer at ``at``: the number, and where the next field begins."""
    cdef long long limit = (1 << prefix_bits) - 1, value
    cdef Py_ssize_t index = 1
    cdef int shift = 0
    cdef unsigned char byte
    if at >= size:
        raise HeaderBlockError("Unable to decode HPACK integer representation")
    value = data[at] & limit
    if value == limit:
        while True:
            if at + index >= size:
                raise HeaderBlockError("Unable to decode HPACK integer representation")
            byte = data[at + index]
            index += 1
            if byte >= 128:
                value += <long long> (byte - 128) << shift
            else:
                value += <long long> byte << shift
                break
            shift += 7
            if index > VARINT_MAX_LENGTH:
                raise HeaderBlockError("Variable integer representation is too long")
    number[0] = value
    return at + index


cdef class HeaderDecoder:
    """One peer's header blocks decoded against its dynamic table (newest entry last in ``entries``)."""

    def __cinit__(self, Py_ssize_t max_header_list_size):
        self.entries = []
        self.size = 0
        self.maxsize = self.max_allowed = DEFAULT_TABLE_SIZE
        self.max_list = max_header_list_size

    cpdef tuple decode(self, bytes block):
        """The block's fields, as a new list of (name, value) bytes pairs, and their size as RFC 7541 4.1 counts
        it (guard.decoded_size); raises HeaderBlockError."""
        cdef const unsigned char* data = <const unsigned char*> PyBytes_AS_STRING(block)
        cdef Py_ssize_t size = len(block), at = 0, listed = 0
        cdef long long number
        cdef unsigned char first
        cdef list headers = []
        cdef tuple header
        while at < size:
            first = data[at]
            if first & 0x80:
                at = _integer(data, size, at, 7, &number)
                header = self._get(number)
            elif first & 0x40:
                header, at = self._literal(data, size, at, True)
            elif first & 0x20:
                if headers:
                    raise HeaderBlockError("Table size update not at the start of the block")
                at = _integer(data, size, at, 5, &number)
                if number > self.max_allowed:
                    raise HeaderBlockError("Encoder exceeded max allowable table size")
                self._resize(<Py_ssize_t> number)
                continue
            else:
                header, at = self._literal(data, size, at, False)
            headers.append(header)
            listed += 32 + len(<bytes> header[0]) + len(<bytes> header[1])
            if listed > self.max_list:
                raise HeaderBlockError(f"A header list larger than {self.max_list} has been received")
        if self.maxsize > self.max_allowed:
            raise HeaderBlockError("Encoder did not shrink table size to within the max")
        return headers, listed

    def table(self):
        """The dynamic table, newest entry first, and its maximum size (as hpack's HeaderTable holds them)."""
        return list(reversed(self.entries)), self.maxsize

    cdef tuple _get(self, long long index):
        cdef Py_ssize_t dynamic
        if 1 <= index <= _STATIC_LENGTH:
            return <tuple> _STATIC[index - 1]
        dynamic = len(self.entries)
        if _STATIC_LENGTH < index <= _STATIC_LENGTH + dynamic:
            return <tuple> self.entries[dynamic - 1 - (index - _STATIC_LENGTH - 1)]
        raise HeaderBlockError(f"Invalid table index {index}")

    cdef tuple _literal(self, const unsigned char* data, Py_ssize_t size, Py_ssize_t at, bint indexing):
        """A literal field (with incremental indexing, or without / never indexed) and where the next begins."""
        cdef long long number
        cdef Py_ssize_t end
        cdef bytes name, value
        cdef int name_index = data[at] & (0x3F if indexing else 0x0F)
        if name_index:
            at = _integer(data, size, at, 6 if indexing else 4, &number)
            name = <bytes> self._get(number)[0]
        else:
            at += 1
            end = _integer(data, size, at, 7, &number)
            if number > size - end:
                raise HeaderBlockError("Truncated header block")
            name = _huffman(data + end, number) if data[at] & 0x80 else \
                PyBytes_FromStringAndSize(<const char*> data + end, number)
            at = end + number
        end = _integer(data, size, at, 7, &number)
        if number > size - end:
            raise HeaderBlockError("Truncated header block")
        value = _huffman(data + end, number) if data[at] & 0x80 else \
            PyBytes_FromStringAndSize(<const char*> data + end, number)
        header = (name, value)
        if indexing:
            self._add(header, 32 + len(name) + len(value))
        return header, end + number

    cdef void _add(self, tuple header, Py_ssize_t size):
        if size > self.maxsize:
            del self.entries[:]
            self.size = 0
        else:
            self.entries.append(header)
            self.size += size
            self._shrink()

    cdef void _shrink(self):
        cdef tuple evicted
        while self.size > self.maxsize:
            evicted = <tuple> self.entries.pop(0)
            self.size -= 32 + len(<bytes> evicted[0]) + len(<bytes> evicted[1])

    cdef void _resize(self, Py_ssize_t maxsize):
        cdef Py_ssize_t old = self.maxsize
        self.maxsize = maxsize
        if maxsize <= 0:
            del self.entries[:]
            self.size = 0
        elif old > maxsize:
            self._shrink()



# A request head's rules (RFC 9113 8.2 and 8.3): rules.py_request_head is the reference, and what runs without this
# module; every new call's head is checked, so in Python it cost a few µs a call.
cdef frozenset _REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
cdef frozenset _CONNECTION_FIELDS = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                               b"upgrade"})


cdef inline bint _upper(bytes name):
    """Whether ``name`` has an upper-case ASCII letter (``name != name.lower()``)."""
    cdef const unsigned char* data = <const unsigned char*> PyBytes_AS_STRING(name)
    cdef Py_ssize_t i
    for i in range(len(name)):
        if 65 <= data[i] <= 90:
            return True
    return False


cpdef str field_problem(bytes name, bytes value):
    """rules.py_field_problem: why a regular field cannot be in an HTTP/2 request head or trailers, or None."""
    if _upper(name):
        return "an upper-case header field name"
    if name in _CONNECTION_FIELDS:
        return f"the connection-specific field {name.decode('latin-1')}"
    if name == b"te" and value != b"trailers":
        return "TE other than trailers"
    return None


cpdef tuple request_head(list headers):
    """rules.py_request_head: a request head read in one pass: why it is malformed (or None), its :method, its
    :path and its declared content-length (-1 when it is not a number; None without one)."""
    cdef bint regular = False
    cdef int methods = 0, schemes = 0, paths = 0
    cdef bytes name, value, method = b"", path = b""
    cdef str problem
    length = None
    for name, value in headers:
        if len(name) and PyBytes_AS_STRING(name)[0] == 58:  # a pseudo-header field (":")
            if regular:
                return "a pseudo-header field after a regular one", method, path, length
            if name not in _REQUEST_PSEUDO:
                return f"the pseudo-header field {name.decode('latin-1')} in a request", method, path, length
            if name == b":path":
                if not value:
                    return "an empty :path", method, path, length
                path = value
                paths += 1
            elif name == b":method":
                method = value
                methods += 1
            elif name == b":scheme":
                schemes += 1
            continue
        regular = True
        if name == b"content-length":
            if length is None:
                length = int(value) if value.isdigit() else -1
        elif name in _CONNECTION_FIELDS or name == b"te" or _upper(name):
            problem = field_problem(name, value)
            if problem is not None:
                return problem, method, path, length
    for count, what in ((methods, ":method"), (schemes, ":scheme"), (paths, ":path")):
        if count != 1:
            return f"{'no' if count == 0 else 'more than one'} {what}", method, path, length
    return None, method, path, length


cdef inline Py_ssize_t _put_length(unsigned char* out, Py_ssize_t at, Py_ssize_t value):
    """HPACK's integer with a 7-bit prefix and the H bit clear (h2._integer(value, 7)) at ``at``; where it ends."""
    if value < 127:
        out[at] = <unsigned char> value
        return at + 1
    out[at] = 127
    at += 1
    value -= 127
    while value >= 128:
        out[at] = <unsigned char> ((value & 0x7F) | 0x80)
        at += 1
        value >>= 7
    out[at] = <unsigned char> value
    return at + 1


cpdef bytes encode(object headers):
    """h2.py_encode: a header block of literal fields without indexing (no dynamic table), from (name, value)
    bytes pairs, in one allocation."""
    cdef list fields = headers if type(headers) is list else list(headers)
    cdef Py_ssize_t room = 0, at = 0
    cdef bytes name, value, out
    cdef unsigned char* data
    for name, value in fields:
        if len(name) >= 1 << 28 or len(value) >= 1 << 28:
            raise ValueError("a header field of 256 MiB or more")
        room += 1 + 5 + len(name) + 5 + len(value)  # a length takes 5 bytes at most below 2**28
    out = PyBytes_FromStringAndSize(NULL, room)
    data = <unsigned char*> PyBytes_AS_STRING(out)
    for name, value in fields:
        data[at] = 0
        at = _put_length(data, at + 1, len(name))
        memcpy(data + at, PyBytes_AS_STRING(name), len(name))
        at += len(name)
        at = _put_length(data, at, len(value))
        memcpy(data + at, PyBytes_AS_STRING(value), len(value))
        at += len(value)
    return out[:at] if at != room else out
