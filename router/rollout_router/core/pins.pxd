# The session table's declared interface: ``kept`` (the policy's and the native lane's sticky hit) reads and
# moves pins in C.
cdef class SessionTable:
    cdef readonly object pins        # key -> its pin (an OrderedDict, least recently used first)
    cdef readonly list replicas      # slot -> replica id
    cdef dict _slots
    cdef object _counters
    cdef public object max_sessions
    cdef public object idle_ttl
    cdef _evict_over_size(self)

cpdef bint idle(object packed, object ttl, double now) except -1
cpdef object used_now(object packed, double now)
cpdef object replica_slot(object packed)
