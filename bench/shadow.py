"""3. Shadow overhead: Embed throughput and p50 with the shadow at its default sample rate
(koder.toml) against the shadow off, two servers loaded in alternating rounds.

A cost is only as telling as the work the shadow did meanwhile, so the report also gives
what the shadow took from the measured rounds, read from AdminService.ShadowStatus before
and after them: vectors compared, batches timed A/B/A, samples dropped, errors.
"""

from __future__ import annotations

import time

from bench.common import ROOT, run_concurrent, start_server, table
from ragplane.testkit.texts import sentences
from ragplane.v1 import admin_pb2, admin_pb2_grpc, embed_pb2, embed_pb2_grpc

ROUNDS = 6
PER_ROUND = 96
USE_CASE = "embeddings"
COUNTS = ("compared", "timed_batches", "dropped", "errors")
SETTLE_S = 120.0


def _shadow_counts(admin: admin_pb2_grpc.AdminServiceStub) -> dict:
    """The case's evidence so far for its current shadow release: vectors compared
    (`samples`), A/B/A-timed batches, dropped samples, errors; with the configured rate."""
    reply = admin.ShadowStatus(admin_pb2.ShadowStatusRequest(use_case=USE_CASE))
    case = reply.cases[0]
    mine = [r for r in case.releases if r.shadow == case.shadow]
    return {
        "status": case.status,
        "sample_rate": case.sample_rate,
        "compared": sum(r.samples for r in mine),
        "timed_batches": sum(r.timed_batches for r in mine),
        "dropped": sum(r.dropped for r in mine),
        "errors": sum(r.errors for r in mine),
    }


def _settled(admin: admin_pb2_grpc.AdminServiceStub, quiet_s: float = 3.0) -> dict:
    """`_shadow_counts` once they have not moved for `quiet_s` (at most SETTLE_S): the
    shadow works off the request path, so a sample taken in a round may end after it."""
    counts = _shadow_counts(admin)
    start = still = time.monotonic()
    while time.monotonic() - still < quiet_s and time.monotonic() - start < SETTLE_S:
        time.sleep(0.5)
        now = _shadow_counts(admin)
        if now != counts:
            counts, still = now, time.monotonic()
    return counts


def run() -> tuple[dict, str]:
    try:
        from embedder_rs import Embedder  # noqa: F401
    except ImportError as exc:
        return {"skipped": str(exc)}, f"Skipped: embedder_rs is not installed ({exc})."
    texts = list(sentences())[: ROUNDS * PER_ROUND]
    on = start_server("embedder=auto", f"koder_toml={ROOT / 'koder.toml'}", "device=cpu")
    off = start_server("embedder=auto", "koder_toml=", "device=cpu")
    stats = {"on": [], "off": []}
    try:
        admin = admin_pb2_grpc.AdminServiceStub(on.channel())
        stubs = {
            k: embed_pb2_grpc.EmbedServiceStub(s.channel()) for k, s in (("on", on), ("off", off))
        }
        for s in stubs.values():
            s.Embed(embed_pb2.EmbedRequest(texts=texts[:8]))
        before = _settled(admin)  # what the warm-up call gave the shadow is not counted
        for r in range(ROUNDS):
            batch = texts[r * PER_ROUND : (r + 1) * PER_ROUND]
            for k in ("on", "off") if r % 2 == 0 else ("off", "on"):
                stats[k].append(
                    run_concurrent(
                        lambda t, s=stubs[k]: s.Embed(embed_pb2.EmbedRequest(texts=[t])), batch, 8
                    )
                )
        after = _settled(admin)
    finally:
        on.stop()
        off.stop()
    res: dict = {}
    for k, loads in stats.items():
        lat = sorted(x for ld in loads for x in ld.latencies)
        res[k] = {
            "texts_per_s": sum(ld.done for ld in loads) / sum(ld.seconds for ld in loads),
            "p50_ms": lat[len(lat) // 2] * 1e3,
        }
    res["throughput_cost"] = 1 - res["on"]["texts_per_s"] / res["off"]["texts_per_s"]
    res["p50_cost"] = res["on"]["p50_ms"] / res["off"]["p50_ms"] - 1
    served = sum(ld.done for ld in stats["on"])
    took = {k: after[k] - before[k] for k in COUNTS}
    res["shadow"] = {
        "status": after["status"],
        "sample_rate": after["sample_rate"],
        "texts_served": served,
        **took,
    }
    md = table(
        ["shadow", "texts/s", "p50 ms"],
        [[k, f"{res[k]['texts_per_s']:,.1f}", f"{res[k]['p50_ms']:.1f}"] for k in ("off", "on")],
    )
    md += (
        f"\n\nCost of the shadow at the default sample rate: "
        f"{res['throughput_cost'] * 100:.1f}% of throughput, p50 {res['p50_cost'] * 100:+.1f}% "
        "(concurrency 8, one text per call, alternating rounds).\n\n"
        f"What the shadow took from the measured rounds (case {USE_CASE}, "
        f"{after['status']}, sample rate {after['sample_rate']:g} of batches): it compared "
        f"{took['compared']:,} of the {served:,} texts served ({took['compared'] / served:.1%}), "
        f"timed {took['timed_batches']} batches A/B/A, dropped {took['dropped']}, "
        f"errors {took['errors']} (AdminService.ShadowStatus before and after the rounds)."
    )
    return res, md
