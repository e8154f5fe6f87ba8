"""The listeners that carry traffic to replicas (HTTP now; gRPC beside it later)."""
