# The kept-pin rule's declared interface: the native lane's sticky hit calls ``kept`` in C.
from rollout_router.core.pins cimport SessionTable

cpdef bint within(object loads, object load, object margin) except -1
cpdef object kept(SessionTable table, object loads, object key, double now, object margin)
