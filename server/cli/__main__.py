"""`python -m server.cli ...`, as the test harness and load tests start a server."""

from server.cli import main

main()
