# The tallies' declared interface: the native lane's answer counts into them in C.
cimport cython

cdef class CounterChild:
    cdef public object value
    cdef public double created
    cpdef inc(self, object amount=*)

cdef class HistogramChild:
    cdef public tuple bounds
    cdef public list counts
    cdef public double sum
    cdef public double created
    @cython.locals(low=Py_ssize_t, high=Py_ssize_t, middle=Py_ssize_t, bound=double)
    cpdef observe(self, double value)

cdef class Sampler:
    cdef public double rate, credit
    cpdef bint sample(self) except -1
