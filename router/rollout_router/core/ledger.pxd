# The in-flight ledger's declared interface: the native lane's sticky hit counts its requests in C.
from rollout_router.core.loads cimport LoadIndex

cpdef recount(object replica, LoadIndex http, LoadIndex grpc)
cpdef take(object replica, LoadIndex http, LoadIndex grpc)
cpdef put(object replica, LoadIndex http, LoadIndex grpc)
