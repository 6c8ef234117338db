"""For operators: `locust -f loadtest/locustfile.py --host 127.0.0.1:50051` (web UI) or
`... --headless -u 16 -r 8 -t 30s`. Pick scenarios by class name on the command line
(`EmbedHeavy SearchHeavy Ingest Memory Mixed`); without names Locust runs all five at once.

Each test start creates and seeds fresh collections (`--seed-items`, default 1000) and each
stop deletes them. $RAGPLANE_API_KEY, when set, is sent as `authorization: Bearer`.
`python -m loadtest` is the scripted equivalent with a summary and an exit status.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Locust puts this file's directory on sys.path, not the repository root that holds the
# `loadtest`, `ragplane` and `tests` packages.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from locust import events  # noqa: E402

from loadtest import fixtures  # noqa: E402
from loadtest.scenarios import EmbedHeavy, Ingest, Memory, Mixed, SearchHeavy  # noqa: E402

__all__ = ["EmbedHeavy", "Ingest", "Memory", "Mixed", "SearchHeavy"]


@events.init_command_line_parser.add_listener
def _add_arguments(parser) -> None:
    parser.add_argument(
        "--seed-items",
        type=int,
        default=fixtures.seed_items_default(),
        env_var=fixtures.SEED_ITEMS_ENV,
        help="items seeded into the search collection at test start",
    )


@events.test_start.add_listener
def _prepare(environment, **_kw) -> None:
    if environment.parsed_options is None:  # `python -m loadtest` prepares on its own
        return
    if not environment.host:
        raise SystemExit("set --host, e.g. --host 127.0.0.1:50051")
    fixtures.prepare(environment.host, environment.parsed_options.seed_items)


@events.test_stop.add_listener
def _cleanup(environment, **_kw) -> None:
    if environment.parsed_options is not None:
        fixtures.cleanup()
