"""`python -m bench.service_g2`: G2 measured in the service, under the Locust mixed scenario.

Starts `ragplane serve` with the real model (the device's canonical, ONNX Runtime on a
CPU) and the repository's embeddings pair with embedder_rs at sample_rate = 1.0 and every
sampled batch timed A/B/A (timing_rate = 1.0), `policy = "manual"` so nothing flips; runs
`python -m loadtest --scenario mixed` against it; waits for the shadow queue to drain and
reads ShadowStatus: the time ratio, its upper 95% bound and the number of timed batches
(G2 needs >= 30), the A/A noise floor and G1's numbers. The gates are the repository's
(koder.toml), minimums included.

With `--quiet-and-loaded` it runs twice on fresh servers, one Locust user (requests one
after another: the quiet hours) and then `--users` (8 by default: the busy hours), and
reports G2 from both side by side with what the shadow did with every offered batch:
sampled (how many while requests waited), skipped because requests waited, dropped. The
loaded run passes when offered = sampled + skipped + dropped in every class and the share
sampled under load is at least the pair's min_busy_share.

Exit status: 0 when G1 and G2 both hold, 3 when either does not, 4 when fewer timed
batches than G2 asks for were taken, 1 when the load test failed, 2 without embedder_rs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT
from bench.flip import (
    EXIT_HELD,
    EXIT_NO_RUST,
    cli,
    gate_lines,
    live_release,
    shadow_case,
    start,
    write_koder,
)
from ragplane.server.shadow.releases import FILE_NAME

# the model is loaded offline by the processes this starts
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

EXIT_FEW = 4


def run_load(port: int, users: int, seconds: int, seed_items: int, out: Path) -> int:
    cmd = [
        sys.executable,
        "-m",
        "loadtest",
        "--scenario",
        "mixed",
        "--host",
        f"127.0.0.1:{port}",
        "--users",
        str(users),
        "--spawn-rate",
        str(users),
        "--run-time",
        f"{seconds}s",
        "--seed-items",
        str(seed_items),
        "--json-out",
        str(out),
    ]
    print("$ " + " ".join(cmd[1:]).replace(str(out), "summary.json"), flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode


def measure(
    users: int = 4, run_time: int = 210, seed_items: int = 200, record: bool = False
) -> dict:
    """One load run against a fresh server; the live evidence of its shadow release. With
    `record`, and only when the load test succeeded (exit 0, no failed request), the server
    records that evidence in its release history under its own gates (the repository's:
    `ragplane shadow record-release` refuses a release that fails G1 or G2), and the entry
    is copied into the repository's history."""
    import embedder_rs

    work = Path(tempfile.mkdtemp(prefix="ragplane-g2-"))
    koder = write_koder(work, policy="manual", minimums={}, timing_rate=1.0)
    srv = start(koder, work / "data")
    try:
        rc = run_load(srv.port, users, run_time, seed_items, work / "load.json")
        # the shadow worker may still hold sampled batches: let it finish them
        before, case = -1, shadow_case(srv.channel())
        while live_release(case).samples != before:
            before = live_release(case).samples
            time.sleep(2.0)
            case = shadow_case(srv.channel())
        load = json.loads((work / "load.json").read_text()) if (work / "load.json").exists() else {}
        failures = load.get("total", {}).get("failures")
        recorded = ""
        if record and (rc != 0 or failures != 0):
            recorded = f"not recorded: the load test failed (exit {rc}, {failures} failed requests)"
        elif record:
            try:
                recorded = cli(srv.port, "record-release")
                shutil.copy(work / FILE_NAME, ROOT / FILE_NAME)
            except RuntimeError as exc:  # refused: the release fails a gate (its numbers say)
                recorded = str(exc)
        if recorded:
            print(recorded, flush=True)
    finally:
        srv.stop()
    shutil.rmtree(work, ignore_errors=True)
    rel = live_release(case)
    g1, g2 = case.gates[0], case.gates[1]
    return {
        "embedder_rs": embedder_rs.__version__,
        "shadow": case.shadow,
        "canonical": case.canonical,
        "users": users,
        "run_time_s": run_time,
        "load_exit": rc,
        "load_requests": load.get("total", {}).get("requests"),
        "load_failures": load.get("total", {}).get("failures"),
        "samples": rel.samples,
        "cosine_min": rel.cosine_min,
        "cosine_mean": rel.cosine_mean,
        "overlap_at_10": rel.overlap_at_10,
        "probes": rel.probes,
        "time_ratio": rel.time_ratio,
        "time_ratio_upper95": rel.time_ratio_upper,
        "aa_time_ratio": rel.aa_time_ratio,
        "timed_batches": rel.timed_batches,
        "errors": rel.errors,
        "dropped": rel.dropped,
        "offered": rel.batches,
        "sampled": rel.sampled,
        "busy_sampled": rel.busy_sampled,
        "skipped_busy": rel.skipped_busy,
        "seconds": rel.seconds,
        "g1": g1.passed,
        "g2": g2.passed,
        "hardware": case.hardware,
        "kernel": case.kernel,
        "classes": [_class_numbers(c) for c in rel.classes],
        "gates": gate_lines(case)[:2],
        "recorded": recorded,
    }


def _class_numbers(c) -> dict:
    return {
        "name": c.name,
        "share": c.share,
        "timed_batches": c.timed_batches,
        "time_ratio": c.time_ratio,
        "time_ratio_upper95": c.time_ratio_upper,
        "aa_time_ratio": c.aa_time_ratio,
        "cosine_min": c.cosine_min,
        "judged": c.carried,
        "g2": c.passed_g2,
        "offered": c.batches,
        "sampled": c.sampled,
        "busy_sampled": c.busy_sampled,
        "skipped_busy": c.skipped_busy,
        "dropped": c.dropped,
    }


def report(r: dict) -> str:
    return (
        f"Locust mixed, {r['users']} users, {r['run_time_s']} s "
        f"({r['load_requests']} requests, {r['load_failures']} failed), {r['shadow']} vs "
        f"{r['canonical']}, sample_rate 1.0, every sample timed A/B/A:\n\n"
        f"| time ratio | upper 95% | timed batches | A/A | vectors compared | min cos | "
        f"mean cos | overlap@10 (probes) | dropped | errors | G1 | G2 |\n" + "|---" * 12 + "|\n"
        f"| {r['time_ratio']:.3f} | {r['time_ratio_upper95']:.3f} | {r['timed_batches']} | "
        f"{r['aa_time_ratio']:.3f} | {r['samples']} | {r['cosine_min']:.7f} | "
        f"{r['cosine_mean']:.8f} | {r['overlap_at_10']:.3f} ({r['probes']}) | {r['dropped']} | "
        f"{r['errors']} | {'pass' if r['g1'] else 'fail'} | {'pass' if r['g2'] else 'fail'} |"
        + "\n\n"
        + f"Per traffic class (G2 judges each class with >= 5% of batches), hardware "
        f"`{r.get('hardware', '')}`, kernel `{r.get('kernel', '')}`:\n\n"
        "| class | share | timed batches | time ratio | upper 95% | A/A | min cos | judged | G2 |\n"
        + "|---" * 9
        + "|\n"
        + "".join(
            f"| {c['name']} | {c['share']:.0%} | {c['timed_batches']} | {c['time_ratio']:.3f} | "
            f"{c['time_ratio_upper95']:.3f} | {c['aa_time_ratio']:.3f} | {c['cosine_min']:.7f} | "
            f"{'yes' if c['judged'] else 'no'} | {'pass' if c['g2'] else 'fail'} |\n"
            for c in r.get("classes", [])
        )
        + "\n"
        + "\n".join(f"- {line.strip()}" for line in r["gates"])
        + "\n\nCommand: `python -m bench.service_g2` (`make service-g2`). The flip end to end: "
        "`python -m bench.flip` (`make flip-demo`), which flips, or names the gate that "
        "holds it back with its numbers and exits 3."
    )


def busy_share(c: dict) -> float:
    """Of the batches offered while requests waited, the share sampled (1.0 with none)."""
    busy = c["busy_sampled"] + c["skipped_busy"]
    return c["busy_sampled"] / busy if busy else 1.0


def compare_report(quiet: dict, loaded: dict, min_share: float) -> str:
    """Quiet and loaded runs side by side, per traffic class."""
    rows = []
    for label, r in (("quiet", quiet), ("loaded", loaded)):
        for c in r["classes"]:
            rows.append(
                f"| {label} ({r['users']} user{'s' if r['users'] > 1 else ''}) | {c['name']} | "
                f"{c['offered']} | {c['sampled']} ({c['busy_sampled']}) | {c['skipped_busy']} | "
                f"{c['dropped']} | {busy_share(c):.0%} | {c['timed_batches']} | "
                f"{c['time_ratio']:.3f} | {c['time_ratio_upper95']:.3f} | {c['aa_time_ratio']:.3f} "
                f"| {'pass' if c['g2'] else 'fail'} |"
            )
    head = (
        "| run | class | offered | sampled (under load) | skipped busy | dropped | "
        "sampled share under load | timed | time ratio | upper 95% | A/A | G2 |\n"
        + "|---" * 12
        + "|\n"
    )
    return (
        f"{quiet['shadow']} vs {quiet['canonical']} (hardware `{quiet['hardware']}`, kernel "
        f"`{quiet['kernel']}`), Locust mixed, {quiet['run_time_s']} s each on a fresh server, "
        f"sample_rate 1.0, every sample timed A/B/A; min_busy_share {min_share:g}:\n\n"
        + head
        + "\n".join(rows)
        + "\n\n"
        + "".join(
            f"- {label}: {r['load_requests']} requests ({r['load_failures']} failed); pooled "
            f"ratio {r['time_ratio']:.3f}, upper 95% {r['time_ratio_upper95']:.3f} over "
            f"{r['timed_batches']} timed batches; G1 {'pass' if r['g1'] else 'fail'} (min cos "
            f"{r['cosine_min']:.7f}), G2 {'pass' if r['g2'] else 'fail'}; "
            f"{r['seconds']:.0f} s of observed shadow time\n"
            for label, r in (("quiet", quiet), ("loaded", loaded))
        )
        + "\nCommand: `python -m bench.service_g2 --quiet-and-loaded` (`make service-g2-load`)."
    )


def accounting_holds(r: dict, min_share: float) -> list[str]:
    """What the loaded run's accounting breaks, if anything."""
    bad = []
    for c in r["classes"]:
        if c["offered"] != c["sampled"] + c["skipped_busy"] + c["dropped"]:
            bad.append(f"{c['name']}: offered {c['offered']} != sampled + skipped + dropped")
        busy = c["busy_sampled"] + c["skipped_busy"]
        # a busy batch past the share that the full queue refused is a drop, not a skip
        if busy and c["busy_sampled"] + c["dropped"] < min_share * busy - 1:
            bad.append(f"{c['name']}: {busy_share(c):.0%} sampled under load < {min_share:g}")
    return bad


def run() -> tuple[dict, str]:
    """The `python -m bench --only service` section: a quiet and a loaded run."""
    try:
        import embedder_rs

        embedder_rs.__version__  # noqa: B018
    except (ImportError, AttributeError) as exc:
        return {"skipped": str(exc)}, f"Skipped: embedder_rs is not installed ({exc})."
    r, text, _ = quiet_and_loaded(8, 120, 200)
    return r, text


def quiet_and_loaded(users: int, seconds: int, seed_items: int) -> tuple[dict, str, list[str]]:
    """Both runs, their report, and what the loaded run's accounting breaks."""
    from ragplane.server.shadow.config import load_pairs

    min_share = load_pairs(ROOT / "koder.toml")["embeddings"].min_busy_share
    quiet = measure(1, seconds, seed_items)
    loaded = measure(users, seconds, seed_items)
    bad = accounting_holds(loaded, min_share)
    text = compare_report(quiet, loaded, min_share) + "".join(
        f"\n- accounting: {line}" for line in bad
    )
    return {"quiet": quiet, "loaded": loaded, "accounting": bad}, text, bad


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.service_g2", description=__doc__)
    p.add_argument("--users", type=int, default=4, help="Locust users (closed loop)")
    p.add_argument(
        "--run-time",
        type=int,
        default=210,
        help="seconds of load (2 cores: ~210 s reach G1's 1,000 compared vectors)",
    )
    p.add_argument("--seed-items", type=int, default=200, help="passages seeded for search")
    p.add_argument("--json-out", default="", help="also write the numbers here")
    p.add_argument(
        "--record",
        action="store_true",
        help="record the evidence as this release's entry in self-hosted-releases.json",
    )
    p.add_argument(
        "--quiet-and-loaded",
        action="store_true",
        help="one run with 1 user, one with --users (8 unless given), side by side",
    )
    args = p.parse_args()
    try:
        import embedder_rs

        embedder_rs.__version__  # noqa: B018
    except (ImportError, AttributeError) as exc:
        print(f"embedder_rs is not installed ({exc}); `make install` builds it")
        return EXIT_NO_RUST
    if args.quiet_and_loaded:
        return _quiet_and_loaded(args)
    r = measure(args.users, args.run_time, args.seed_items, args.record)
    print("\n" + report(r))
    print("\n".join(r["gates"]))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(r, indent=2))
    if r["load_exit"]:
        print(f"the load test failed (exit {r['load_exit']})")
        return 1
    if r["timed_batches"] < 30:
        return EXIT_FEW
    return 0 if r["g1"] and r["g2"] else EXIT_HELD


def _quiet_and_loaded(args: argparse.Namespace) -> int:
    users = args.users if args.users != 4 else 8
    r, text, bad = quiet_and_loaded(users, args.run_time, args.seed_items)
    print("\n" + text)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(r, indent=2))
    return 1 if bad or r["quiet"]["load_exit"] or r["loaded"]["load_exit"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
