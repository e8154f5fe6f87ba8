# The load index's declared interface: the native lane's sticky hit and the ledger move replicas in C.
cimport cython

cdef class LoadIndex(dict):
    cdef dict _at, _sorted, _moved
    cdef object _min, _total, _ordered
    cpdef object min(self)
    cpdef list tied(self)
    cpdef object total(self)
    cpdef tuple ordered(self)
    cpdef set(self, object replica, object load)
    cpdef move(self, object replica, object load)
    cpdef discard(self, object replica)
    cdef _settle(self)
    cdef _refile(self, object replica, object old, object load)
    cdef _leave(self, object replica, object load)

@cython.locals(index=LoadIndex)
cpdef object lowest(object loads)
