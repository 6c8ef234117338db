"""Helpers shared by tests/, bench/ and loadtest/: a real server to dial, and real text.

Installed with the project (tests/ is not), so benchmarks and load tests import it too.
"""
