# The in-flight ledger's declared interface: the native lane's sticky hit counts its requests in C.
from rollout_router.core.loads cimport LoadIndex
from rollout_router.core.replica cimport ReplicaState

cpdef recount(ReplicaState replica, LoadIndex http, LoadIndex grpc)
cpdef take(ReplicaState replica, LoadIndex http, LoadIndex grpc)
cpdef put(ReplicaState replica, LoadIndex http, LoadIndex grpc)
