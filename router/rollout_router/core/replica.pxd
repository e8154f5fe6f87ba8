# A replica's counted part, declared: the ledger, an answer's record and the native lane read and write it in C.
cdef class ReplicaState:
    cdef public str id
    cdef public object grpc_target
    cdef public long long inflight, external, failures, server_errors
