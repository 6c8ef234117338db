"""`python -m ragplane.server.cli ...`, as the test harness and load tests start a server."""

from ragplane.server.cli import main

main()
