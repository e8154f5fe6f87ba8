module rolloutrouter.dev/benchmarks/grpcload

go 1.24.0

require golang.org/x/net v0.47.0

require golang.org/x/text v0.31.0 // indirect
