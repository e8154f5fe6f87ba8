# The declared interface of the compiled HTTP/2 frame engine (_grpc_frames.pyx); h2.py holds the pure-Python
# reference of each function, which the same tests run (tests/test_grpc_frames.py compares the two).

cpdef tuple split_frames(bytearray buffer, Py_ssize_t limit, Py_ssize_t head_work=*)
cpdef bytes frame(int kind, int flags, unsigned int stream_id, object payload=*)
cpdef bytes encode(object headers)
cpdef str field_problem(bytes name, bytes value)
cpdef tuple request_head(list headers)


cdef class HeaderDecoder:
    cdef list entries  # the dynamic table, oldest first
    cdef Py_ssize_t size, maxsize, max_allowed, max_list
    cpdef tuple decode(self, bytes block)
    cdef tuple _get(self, long long index)
    cdef tuple _literal(self, const unsigned char* data, Py_ssize_t size, Py_ssize_t at, bint indexing)
    cdef void _add(self, tuple header, Py_ssize_t size)
    cdef void _shrink(self)
    cdef void _resize(self, Py_ssize_t maxsize)


cdef class Stream:
    # outbound.Stream's fields (its pure-Python reference): one stream as its connection sees it
    cdef public object id, owner, conn, pending, closing, expected
    cdef public Py_ssize_t window, unacked, got
    cdef public bint ended


cdef class ConnFields:
    # outbound.PyConnFields' fields (its pure-Python reference): what the relay reads and writes of a connection
    cdef public object transport, streams, out, blocked, guard, continuing, decoder
    cdef public bytearray buffer  # read, not yet handled
    cdef public object preface, head_since  # the peer's connection preface awaited; a head begun at, not yet whole
    cdef public Py_ssize_t window, peer_window, unacked, stream_window
    cdef public bint closed, write_paused, yielding, head_clock


cdef class CallFields:
    # call.PyCallFields' fields (its pure-Python reference): what the relay reads and writes of a call
    cdef public object client, stream, upstream, ustream, turn, last, code
    cdef public bint first, relayed, answered, finished
    cdef public Py_ssize_t heard
    cdef public double first_at  # the attempt's first response message (monotonic; 0: none), when it has no turn


cpdef bint work(ConnFields conn, bytearray buffer, Py_ssize_t limit, Py_ssize_t head_work, list dirty, type relay)
cpdef reading_with(Py_ssize_t limit, list dirty, list reading, type relay, frozenset hop)
cpdef bint read(ConnFields conn, bytearray buffer, Py_ssize_t limit, Py_ssize_t head_work, list dirty, list reading,
                type relay)
