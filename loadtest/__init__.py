"""Locust load tests of ragplane over gRPC.

`python -m loadtest --help` runs one scenario headless for a bounded time and prints a
per-RPC summary; `locust -f loadtest/locustfile.py --host 127.0.0.1:50051` runs them under
Locust's own CLI or web UI. Importing `loadtest.grpc_user` (or anything that imports
Locust) monkey-patches the process with gevent, so this package's `__init__` imports
nothing: tools that only need the package name stay unpatched.
"""
