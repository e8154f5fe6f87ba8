# The routing record's declared interface: the native lane's sticky hit makes one in C.
cimport cython

cdef class Routing:
    cdef public object key, group, decision, replica, turn
    cdef public double start
    cdef public bint held

@cython.locals(routing=Routing)
cpdef Routing routed(object key, object group, object decision, object replica, object turn, double start=*)
