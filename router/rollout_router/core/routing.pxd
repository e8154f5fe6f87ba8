# The routing record's declared interface: the native lane's sticky hit makes one in C.
cdef class Routing:
    cdef public object key, group, decision, replica, turn
    cdef public double start
    cdef public bint held

cpdef Routing routed(object key, object group, object decision, object replica, object turn, double start=*)
