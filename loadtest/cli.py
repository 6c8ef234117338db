"""`python -m loadtest`: one scenario, headless, for a bounded time, against loopback.

Runs Locust as a library (an `Environment` with a local runner) rather than its CLI, so the
run is one process with a summary we control: a table per RPC (requests/s, p50 / p95 / p99,
failures), an optional JSON file for CI, and exit status 1 on any failed call or user error.
"""

from __future__ import annotations

import locust  # first: Locust monkey-patches the process with gevent on import

# isort: split
import argparse
import ipaddress
import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

import gevent
import grpc
from locust.env import Environment
from locust.log import setup_logging
from locust.stats import StatsEntry
from locust.util.timespan import parse_timespan

from loadtest import fixtures
from loadtest.grpc_user import API_KEY_ENV
from loadtest.scenarios import SCENARIOS
from loadtest.server import LocalServer

log = logging.getLogger("loadtest")

EXIT_OK, EXIT_FAILURES, EXIT_USAGE = 0, 1, 2


def parse_duration(text: str) -> float:
    """ "30s", "2m", "1m30s", "45" -> seconds, as Locust's own --run-time reads them."""
    try:
        total = parse_timespan(text.strip())
    except ValueError:
        msg = f"bad duration {text!r}; use e.g. 30s, 2m, 1m30s"
        raise argparse.ArgumentTypeError(msg) from None
    if total <= 0:
        raise argparse.ArgumentTypeError(f"duration must be > 0, got {text!r}")
    return float(total)


def loopback_target(text: str) -> str:
    """HOST:PORT on loopback only: this tool generates load and must not aim it elsewhere."""
    host, sep, port = text.removeprefix("grpc://").rpartition(":")
    host = host.strip("[]")
    try:
        ok = (
            sep
            and port.isdigit()
            and (host == "localhost" or ipaddress.ip_address(host).is_loopback)
        )
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(
            f"--host must be a loopback HOST:PORT such as 127.0.0.1:50051, got {text!r} "
            "(for other targets use `locust -f loadtest/locustfile.py` deliberately)"
        )
    return f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtest",
        description="Run one ragplane load scenario headless and print per-RPC numbers.",
    )
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="mixed")
    p.add_argument("--users", type=int, default=16, help="concurrent users (calls in flight)")
    p.add_argument("--spawn-rate", type=float, default=8.0, help="users started per second")
    p.add_argument("--run-time", type=parse_duration, default=30.0, help="e.g. 30s, 2m")
    target = p.add_mutually_exclusive_group()
    target.add_argument(
        "--host",
        type=loopback_target,
        default=None,
        help="a running server, e.g. 127.0.0.1:50051 (loopback only)",
    )
    target.add_argument(
        "--start-server",
        action="store_true",
        help="start a local server on port 0 in a temporary directory",
    )
    model = p.add_mutually_exclusive_group()
    model.add_argument(
        "--embedder",
        default="auto",
        help="with --start-server: the server's embedder; auto (default: what `ragplane "
        "serve` uses, the real model), sentence-transformers, onnx, embedder_rs",
    )
    model.add_argument(
        "--fake-embedder",
        action="store_const",
        dest="embedder",
        const="fake",
        help="with --start-server: the deterministic fake instead of the model, to measure "
        "the server alone; the header says so",
    )
    p.add_argument(
        "--server-set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="with --start-server: extra `ragplane serve --set` (repeatable)",
    )
    p.add_argument(
        "--seed-items",
        type=int,
        default=None,
        help=f"items seeded for search (default {fixtures.DEFAULT_SEED_ITEMS})",
    )
    p.add_argument("--json-out", type=Path, default=None, help="also write the summary as JSON")
    p.add_argument(
        "--samples-out",
        type=Path,
        default=None,
        help="every --sample-every seconds, append one JSON line: requests, failures and "
        "p50/p99 of the calls that ended in that interval (the soak reads it)",
    )
    p.add_argument("--sample-every", type=parse_duration, default=30.0, help="e.g. 30s")
    p.add_argument("--loglevel", default="WARNING")
    return p


def _entry(e: StatsEntry, duration_s: float) -> dict[str, Any]:
    def pct(q: float) -> float:
        return float(e.get_response_time_percentile(q)) if e.num_requests else 0.0

    return {
        "name": e.name,
        "requests": e.num_requests,
        "failures": e.num_failures,
        "rps": e.num_requests / duration_s if duration_s > 0 else 0.0,
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "avg_ms": e.avg_response_time,
        "max_ms": float(e.max_response_time or 0.0),
        "avg_bytes": e.avg_content_length,
    }


def summarize(
    env: Environment, args: argparse.Namespace, duration_s: float, meta: dict[str, Any]
) -> dict[str, Any]:
    stats = env.stats
    errors = [
        {"count": row["count"], "message": row["msg"], "traceback": row["traceback"]}
        for row in (env.runner.exceptions.values() if env.runner else [])
    ]
    failures = [
        {"rpc": f.name, "error": str(f.error), "count": f.occurrences}
        for f in stats.errors.values()
    ]
    total = _entry(stats.total, duration_s)
    return {
        "scenario": args.scenario,
        "users": args.users,
        "spawn_rate": args.spawn_rate,
        "run_time_s": args.run_time,
        "duration_s": duration_s,
        **meta,
        "rpcs": [_entry(e, duration_s) for _, e in sorted(stats.entries.items())],
        "total": total,
        "failures": failures,
        "user_errors": errors,
        # Locust's own process went above 90% of a core: the client, not the server, may
        # have limited the numbers.
        "client_cpu_saturated": bool(env.runner and env.runner.cpu_warning_emitted),
        "ok": total["failures"] == 0 and not errors and total["requests"] > 0,
    }


def print_summary(s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if console.width < 120:  # piped output defaults to 80 columns: too narrow for 9
        console = Console(width=120)
    table = Table(
        title=(
            f"ragplane load test: {s['scenario']}, {s['users']} users, "
            f"{s['duration_s']:.1f}s, embedder {s['embedder']}"
            + (" -- FAKE: the server without the model" if s["embedder"].startswith("fake") else "")
        ),
        title_justify="left",
    )
    for col in (
        "RPC",
        "requests",
        "failures",
        "req/s",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "max ms",
        "avg bytes",
    ):
        table.add_column(col, justify="left" if col == "RPC" else "right", no_wrap=True)

    def row(r: dict[str, Any], name: str, style: str | None = None) -> None:
        table.add_row(
            name, str(r["requests"]),
            f"[red]{r['failures']}[/]" if r["failures"] else "0",
            f"{r['rps']:.1f}", f"{r['p50_ms']:.0f}", f"{r['p95_ms']:.0f}", f"{r['p99_ms']:.0f}",
            f"{r['max_ms']:.0f}", f"{r['avg_bytes']:.0f}", style=style,
        )  # fmt: skip

    for r in s["rpcs"]:
        row(r, r["name"])
    table.add_section()
    row(s["total"], "total", style="bold")
    console.print(table)
    console.print(
        f"target {s['host']}; {s['seed_items']} items seeded for search in {s['setup_s']:.1f}s "
        f"(not measured); run {s['run_id']}"
    )
    if s["client_cpu_saturated"]:
        console.print(
            "[yellow]note:[/] the load generator used >90% of a core at some point; "
            "the client may have limited throughput (fewer users, or run on a quieter machine)"
        )
    for f in s["failures"]:
        console.print(f"[red]failed[/] {f['rpc']} x{f['count']}: {f['error']}")
    for e in s["user_errors"]:
        console.print(f"[red]user error[/] x{e['count']}: {e['message']}\n{e['traceback']}")
    console.print("[green]OK: no failures[/]" if s["ok"] else "[red]FAILED[/]")


def _interval_percentile(now: dict[int, int], before: dict[int, int], q: float) -> float:
    """The q-quantile (ms) of the calls counted in `now` but not in `before`: Locust's
    cumulative response-time histograms (rounded ms -> count) at two moments."""
    delta = sorted((ms, n - before.get(ms, 0)) for ms, n in now.items() if n > before.get(ms, 0))
    total = sum(n for _, n in delta)
    if not total:
        return 0.0
    seen = 0
    for ms, n in delta:
        seen += n
        if seen >= q * total:
            return float(ms)
    return float(delta[-1][0])


def _sample(env: Environment, every: float, out: Path, start: float) -> None:
    """A greenlet: one JSON line per interval until the run is killed with the runner."""
    before: dict[int, int] = {}
    with out.open("a") as f:
        while True:
            gevent.sleep(every)
            total = env.stats.total
            now = dict(total.response_times)
            line = {
                "t_s": round(time.perf_counter() - start, 1),
                "requests": total.num_requests,
                "failures": total.num_failures,
                "p50_ms": _interval_percentile(now, before, 0.50),
                "p99_ms": _interval_percentile(now, before, 0.99),
            }
            f.write(json.dumps(line) + "\n")
            f.flush()
            before = now


def run(args: argparse.Namespace, host: str) -> dict[str, Any]:
    """Prepare fixtures, run the scenario for args.run_time, stop, clean up, summarize."""
    user_class = SCENARIOS[args.scenario]
    t0 = time.perf_counter()
    st = fixtures.prepare(host, args.seed_items)
    setup_s = time.perf_counter() - t0
    # The shared event hooks (locust.events) are the ones a locustfile registers on, so
    # listeners behave the same here and under `locust -f`.
    env = Environment(user_classes=[user_class], events=locust.events, host=host,
                      stop_timeout=10.0)  # fmt: skip
    runner = env.create_local_runner()
    for sig in (signal.SIGINT, signal.SIGTERM):
        gevent.signal_handler(sig, runner.quit)
    try:
        start = time.perf_counter()
        runner.start(args.users, spawn_rate=args.spawn_rate)
        gevent.spawn_later(args.run_time, runner.quit)
        sampler = None
        if args.samples_out is not None:
            sampler = gevent.spawn(_sample, env, args.sample_every, args.samples_out, start)
        runner.greenlet.join()
        if sampler is not None:
            sampler.kill()
        duration_s = time.perf_counter() - start
    finally:
        fixtures.cleanup()
    return summarize(env, args, duration_s, {
        "host": host, "embedder": st.embedder, "seed_items": st.seed_items,
        "run_id": st.run_id, "setup_s": setup_s,
    })  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.users < 1 or args.spawn_rate <= 0:
        print("--users must be >= 1 and --spawn-rate > 0", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(args.loglevel)
    try:
        if args.start_server:
            with LocalServer(args.embedder, tuple(args.server_set)) as server:
                summary = run(args, server.target)
        else:
            summary = run(args, args.host or "127.0.0.1:50051")
    except grpc.RpcError as exc:  # setup refused: no load was generated
        code = exc.code().name if hasattr(exc, "code") else "ERROR"
        details = exc.details() if hasattr(exc, "details") else str(exc)
        hint = f" (set {API_KEY_ENV})" if code == "UNAUTHENTICATED" else ""
        print(f"error: preparing the load test failed: {code}: {details}{hint}", file=sys.stderr)
        return EXIT_FAILURES
    except grpc.FutureTimeoutError:
        print(
            f"error: no server answered on the target within {fixtures.CONNECT_TIMEOUT_S:.0f}s",
            file=sys.stderr,
        )
        return EXIT_FAILURES
    except (RuntimeError, TimeoutError) as exc:  # the local server did not start
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURES
    print_summary(summary)
    if args.json_out:
        args.json_out.write_text(json.dumps(summary, indent=2) + "\n")
    return EXIT_OK if summary["ok"] else EXIT_FAILURES
