# cython: language_level=3, boundscheck=False, wraparound=False
"""The gRPC relay's frame engine in C: what h2.py's ``split_frames`` and ``frame`` do, per frame relayed.

Every relayed message is a frame parsed from a connection's buffer and a frame built for the other side; in
Python each costs a few microseconds of interpreter work (docs/benchmarks.md, "Where our CPU per call goes").
These are pure functions of their arguments (no Python state read but what is passed in), so h2.py keeps their
pure-Python reference, which runs where this module is not built and which tests compare this one with.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from libc.string cimport memcpy

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
