"""One PostgreSQL and N ragplane servers on it, for the client tests (issue 26).

    python scripts/cluster_for_tests.py [--servers 2] [--set key=value ...]

Run it with the server's virtualenv (it imports ragplane.testkit). It starts a throwaway
PostgreSQL (ragplane.testkit.postgres: initdb and pg_ctl, as the `postgres` user when run
as root), one database, and N `ragplane serve` processes on it (port 0, the fake embedder,
a Prometheus /metrics port each, data directories of their own), then prints one JSON line
on stdout and flushes it:

    {"postgres": "postgresql://...", "servers": [{"addr": "127.0.0.1:P",
      "metrics": "http://127.0.0.1:M/metrics", "pid": 123}, ...]}

or, when PostgreSQL's binaries are not installed, `{"skip": "<why>"}` (exit 0), so that a
test can skip with the reason. It tears everything down when its stdin closes (the test
process ended, however it ended) or on SIGTERM / SIGINT. The servers' logs are in the
temporary folder named by "dir"; on a failed start the last lines go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start_server(base: Path, i: int, url: str, extra: list[str]) -> tuple[subprocess.Popen, Path]:
    from ragplane.testkit.postgres import free_port

    data, port_file, log = base / f"s{i}", base / f"s{i}.port", base / f"s{i}.log"
    args = [sys.executable, "-m", "ragplane.server.cli", "serve", "--port", "0",
            "--data-dir", str(data), "--embedder", "fake",
            "--set", f"store={url}", "--set", f"port_file={port_file}", "--set", "koder_toml=",
            "--set", f"metrics_port={free_port()}"]  # fmt: skip
    for kv in extra:
        args += ["--set", kv]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    return proc, port_file


def wait_port(proc: subprocess.Popen, port_file: Path, deadline: float) -> int:
    while time.monotonic() < deadline:
        text = port_file.read_text().strip() if port_file.exists() else ""
        if text:
            return int(text)
        if proc.poll() is not None:
            raise RuntimeError(f"a ragplane server exited with {proc.returncode}")
        time.sleep(0.05)
    raise RuntimeError("a ragplane server did not write its port in time")


def metrics_port(args: list[str]) -> int:
    return int(next(a for a in args if a.startswith("metrics_port=")).split("=", 1)[1])


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting for every server (repeatable)")  # fmt: skip
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds to start in")
    opts = ap.parse_args()

    from ragplane.testkit.postgres import LocalPostgres, available

    if not available():
        print(json.dumps({"skip": "PostgreSQL's server binaries are not installed "
                                  "(apt install postgresql)"}), flush=True)  # fmt: skip
        return 0
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    base = Path(tempfile.mkdtemp(prefix="ragplane-cluster-"))
    base.chmod(0o755)  # PostgreSQL runs as `postgres` when we are root: it must get in
    pg = LocalPostgres(root=base / "pg")
    procs: list[subprocess.Popen] = []
    try:
        pg.start()
        url = pg.create_database("clients")
        started = [start_server(base, i, url, opts.set) for i in range(opts.servers)]
        procs = [p for p, _ in started]
        deadline = time.monotonic() + opts.timeout
        servers = [
            {"addr": f"127.0.0.1:{wait_port(p, f, deadline)}",
             "metrics": f"http://127.0.0.1:{metrics_port(p.args)}/metrics", "pid": p.pid}
            for p, f in started
        ]  # fmt: skip
        print(json.dumps({"postgres": url, "servers": servers, "dir": str(base)}), flush=True)
        # stdin closing (EOF) is the parent going away; a signal sets `done` too.
        threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
        while not done.wait(0.5):
            pass
        return 0
    except Exception as exc:
        for log in sorted(base.glob("s*.log")):
            sys.stderr.write(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}\n")
        sys.stderr.write(f"cluster_for_tests: {exc} {getattr(exc, 'stderr', '') or ''}\n")
        return 1
    finally:
        stop_all(procs)
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
