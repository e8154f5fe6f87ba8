# The session table's declared interface: ``kept`` (the policy's and the native lane's sticky hit) reads and
# moves pins in C.
cimport cython

cdef class SessionTable:
    cdef readonly object pins        # key -> its pin (an OrderedDict, least recently used first)
    cdef readonly list replicas      # slot -> replica id
    cdef dict _slots
    cdef object _counters
    cdef public object max_sessions
    cdef public object idle_ttl
    cdef _evict_over_size(self)

cpdef bint idle(object packed, object ttl, double now) except -1
cpdef moved(object pins, object key, object packed, double now)
cpdef object used_now(object packed, double now)
@cython.locals(scaled=double, ms='long long')
cpdef object ms_up(double now)
cpdef object replica_slot(object packed)
cdef object _SLOT_BITS, _SLOT_MASK, _USED_BITS, _USED_MASK, _START_SHIFT
cdef object _UNUSED  # (objects: a pin is wider than a C integer)
cdef object _move_to_end
