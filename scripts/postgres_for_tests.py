"""Start (or stop) the one PostgreSQL of a `make test` run, for the e2e suite's pass on a
PostgreSQL store (ragplane.testkit.harness: a database per test server).

    python scripts/postgres_for_tests.py start DIR   # prints the admin URL
    python scripts/postgres_for_tests.py stop DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ragplane.testkit.postgres import LocalPostgres, available


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("start", "stop"):
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[2])
    state = root / "ragplane-test-pg.json"
    if argv[1] == "start":
        if not available():
            print("postgres_for_tests: PostgreSQL is not installed (apt-get install postgresql, "
                  "or scripts/install_postgres.sh as root)", file=sys.stderr)
            return 1
        pg = LocalPostgres(root / "pg").start()
        state.write_text(json.dumps({"port": pg.port}))
        print(pg.url())
        return 0
    if state.exists():
        pg = LocalPostgres(root / "pg", port=json.loads(state.read_text())["port"])
        pg.stop()
        state.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
