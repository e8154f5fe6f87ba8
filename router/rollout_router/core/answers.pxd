# The answer's record's declared interface: the native lane's sticky hit calls ``answered_ok`` in C.
cimport cython

from rollout_router.core.ledger cimport put
from rollout_router.core.loads cimport LoadIndex
from rollout_router.core.replica cimport ReplicaState
from rollout_router.core.routing cimport Routing
from rollout_router.core.tallies cimport HistogramChild, answered_in

cpdef streaks_end(ReplicaState replica)
@cython.locals(replica=ReplicaState)
cpdef bint answered_ok(Routing routing, dict live, dict series, object code, double now, LoadIndex http,
                       LoadIndex grpc) except -1
cpdef turn_recorded(object record, HistogramChild kept_first_byte, object turn, double start, double first_at)
