module rolloutrouter.dev/benchmarks/loadgen

go 1.22
