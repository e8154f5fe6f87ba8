# The decision counters' declared interface: the native lane's sticky hit counts a kept pin in C (``kept_decision``).
cdef class DecisionCounts:
    cdef public long long affinity_kept, affinity_broken, new_sessions, repinned_replica_gone, unkeyed
    cdef public long long evicted_lru, expired_idle, released, group_colocated, group_spilled, restored

cpdef object kept_decision(DecisionCounts counts, object decisions, object replica)
