# The byte budget's declared interface: the native lane charges and releases a request's bytes in C.
cdef class Budget:
    cdef public long long held

cdef class Share:
    cdef readonly Budget budget
    cdef public long long buffered
    cpdef bint charge(self, long long size, long long limit) except -1
    cpdef hold(self, long long size)
    cpdef release(self, long long size)
