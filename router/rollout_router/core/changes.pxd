# The change count's declared interface: the native lane's sticky hit compares ``count`` in C per request.
cdef class Changes:
    cdef public long long count
    cpdef bump(self)
