# The answer's record's declared interface: the native lane's sticky hit calls ``answered_ok`` in C.
from rollout_router.core.loads cimport LoadIndex
from rollout_router.core.tallies cimport CounterChild, HistogramChild

cpdef streaks_end(object replica)
cpdef answered_ok(object replica, CounterChild counter, HistogramChild spread, double seconds, LoadIndex http,
                  LoadIndex grpc)
