# The kept-pin rule's declared interface: the native lane's sticky hit calls ``kept`` in C; ``kept`` calls the
# session table's pin helpers and the load index's ``lowest`` in C too (their own ``.pxd``).
cimport cython

from rollout_router.core.loads cimport lowest
from rollout_router.core.pins cimport SessionTable, idle, moved, replica_slot

cpdef bint within(object loads, object load, object margin) except -1
cpdef object kept(SessionTable table, object loads, object key, double now, object margin)
