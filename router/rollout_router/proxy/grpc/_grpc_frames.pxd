# The declared interface of the compiled HTTP/2 frame engine (_grpc_frames.pyx); h2.py holds the pure-Python
# reference of each function, which the same tests run (tests/test_grpc_frames.py compares the two).

cpdef tuple split_frames(bytearray buffer, Py_ssize_t limit, Py_ssize_t head_work=*)
cpdef bytes frame(int kind, int flags, unsigned int stream_id, object payload=*)
cpdef bint work(object conn, bytearray buffer, Py_ssize_t limit, Py_ssize_t head_work, list dirty, type relay)
cpdef bint read(object conn, bytearray buffer, Py_ssize_t limit, Py_ssize_t head_work, list dirty, list reading,
                type relay)
