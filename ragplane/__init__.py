"""ragplane: a retrieval data plane. The one import name of the server distribution:
`ragplane.server` (the gRPC service), `ragplane.index` (durable collections),
`ragplane.core` (errors, SQLite), `ragplane.testkit` (a real server and real text for tests
and benchmarks) and `ragplane.v1` (the generated API, scripts/gen_protos.py)."""
