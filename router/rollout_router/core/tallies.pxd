# The tallies' declared interface: the native lane's answer counts into them in C.
cimport cython

cdef class CounterChild:
    cdef public object value
    cdef public double created
    cpdef inc(self, object amount=*)

cdef class HistogramChild:
    cdef double[::1] edges               # the bounds as C doubles
    cdef long long[::1] tally            # the counts, one past the bounds (+Inf)
    cdef public double sum
    cdef public double created
    @cython.locals(low=Py_ssize_t, high=Py_ssize_t, middle=Py_ssize_t)
    cpdef observe(self, double value)

cdef class Sampler:
    cdef public double rate, credit
    cpdef bint sample(self) except -1

@cython.locals(counter=CounterChild, spread=HistogramChild)
cpdef answered_in(tuple series, double seconds)
