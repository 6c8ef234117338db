"""The gates G1-G3, judged per traffic class, and the watch after a flip.

  * G1 agreement: enough compared vectors and probes; no shadow error at all; the worst
    vector of every class >= min_cosine; the mean of every carried class >= mean_cosine;
    overlap@10 >= min_overlap.
  * G2 performance: in every carried class, enough timed batches (A/B/A and B/A/B in
    turn), the canonical's A/A floor within max_aa_ratio of the shadow's B/B floor, the
    upper 95% bound of server.shadow.timing's estimate <= max_time_ratio, and the batches
    offered while the server was busy sampled at min_busy_coverage at least (else the
    timings describe the quiet hours only).
  * G3 stability: at least min_releases distinct shadow releases passed G1 and G2 with no
    errors, each measured against the canonical and on the hardware class of the decision
    at hand, over at least min_release_hours of observed shadow time and
    min_release_batches compared batches, no more than max_drop_share of them dropped,
    and not barred by a failed watch. The release history (server.shadow.releases)
    supplies them, each entry signed by a trusted measuring server; the live release
    counts when it meets the same bar now.
  * The watch: while the shadow serves, the same G1 and G2 on its watch evidence; one
    that fails unflips the case and bars that release (its record is permanent) until a
    new release: no flip without force, no record-release, no G3.

A carried class is one with at least min_class_share of the release's sampled batches: a
flip needs every class that real traffic uses to hold, whatever the current mix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType

from ragplane.server.shadow.classes import LIMITS
from ragplane.server.shadow.config import Gates
from ragplane.server.shadow.evidence import ClassRow, StoredRelease
from ragplane.server.shadow.timing import estimate
from ragplane.server.shadow.types import ClassEvidence, GateResult, ReleaseEvidence


def _p1(low: list[float], n: int) -> float:
    return low[min(len(low), max(1, math.ceil(0.01 * n))) - 1] if low else 0.0


def _offered(row: ClassRow) -> int:
    return row.batches + row.dropped + row.skipped


def _class(name: str, row: ClassRow, total: int) -> ClassEvidence:
    """One class's numbers as stored, not yet judged (`judge` does that)."""
    t = estimate(row.timings)
    offered = _offered(row)
    return ClassEvidence(
        name=name,
        batches=offered,
        share=offered / total if total else 0.0,
        samples=row.samples,
        cosine_min=row.cos_min if row.samples else 0.0,
        cosine_mean=row.cos_sum / row.samples if row.samples else 0.0,
        time_ratio=t.ratio,
        time_ratio_upper=t.upper,
        aa_time_ratio=t.aa,
        bb_time_ratio=t.bb,
        aa_bb_lower=t.asymmetry_lower,
        timed_batches=t.batches,
        errors=row.errors,
        dropped=row.dropped,
        sampled=row.batches,
        skipped_busy=row.skipped,
        busy_sampled=row.busy,
    )


def judge_class(c: ClassEvidence, g: Gates) -> ClassEvidence:
    """`c` with carried / passed_g1 / passed_g2 judged under `g`."""
    return replace(c, carried=carried(c, g), passed_g1=class_g1(c, g), passed_g2=class_g2(c, g))


def carried(c: ClassEvidence, g: Gates) -> bool:
    return c.batches > 0 and c.share >= g.min_class_share


def floors_agree(c: ClassEvidence, g: Gates) -> bool:
    """Both orders were timed and the runs do not show the shadow slowing the canonical
    after it by more than max_aa_ratio beyond what the canonical does to the shadow: the
    lower 95% bound of A/A / B/B within it, or the point ratio while too few batches bound
    it (server.shadow.timing: why a bound; the other way round only makes the estimate
    conservative)."""
    aa, bb = c.aa_time_ratio, c.bb_time_ratio
    if aa <= 0 or bb <= 0:
        return False
    shown = c.aa_bb_lower if c.aa_bb_lower > 0 else aa / bb
    return math.log(shown) <= math.log(g.max_aa_ratio) + 1e-12


def _floors_line(c: ClassEvidence) -> str:
    """A/A against B/B, with the lower bound of their ratio where there is one."""
    ratio = c.aa_time_ratio / c.bb_time_ratio if c.bb_time_ratio > 0 else 0.0
    low = f", at least {c.aa_bb_lower:.3f} (95%)" if c.aa_bb_lower > 0 else ""
    return f"A/A {c.aa_time_ratio:.3f} / B/B {c.bb_time_ratio:.3f} = {ratio:.3f}{low}"


def class_g1(c: ClassEvidence, g: Gates) -> bool:
    return (
        c.errors == 0
        and c.samples > 0
        and c.cosine_min >= g.min_cosine
        and c.cosine_mean >= g.mean_cosine
    )


def busy_covered(c: ClassEvidence, g: Gates) -> bool:
    """The batches offered while requests waited were sampled at min_busy_coverage."""
    busy = c.busy_sampled + c.skipped_busy
    return busy == 0 or c.busy_sampled >= g.min_busy_coverage * busy


def class_g2(c: ClassEvidence, g: Gates) -> bool:
    return (
        c.timed_batches >= g.min_timed_batches
        and floors_agree(c, g)
        and c.time_ratio_upper <= g.max_time_ratio
        and busy_covered(c, g)
    )


def release_evidence(s: StoredRelease, g: Gates) -> ReleaseEvidence:
    """The evidence of one stored release: pooled numbers at the top, each class judged."""
    rows = s.classes.values()
    total = sum(_offered(r) for r in rows)
    classes = tuple(_class(name, row, total) for name, row in s.classes.items())
    n = sum(r.samples for r in rows)
    low = sorted(v for r in rows for v in r.low)
    pooled = estimate([t for r in rows for t in r.timings])
    compared = [r for r in rows if r.samples]
    errs = [r for r in rows if r.errors]
    ev = ReleaseEvidence(
        shadow=s.key.release,
        samples=n,
        cosine_min=min((r.cos_min for r in compared), default=0.0),
        cosine_p1=_p1(low, n),
        cosine_mean=sum(r.cos_sum for r in rows) / n if n else 0.0,
        overlap_at_10=s.overlap,
        probes=s.probes,
        time_ratio=pooled.ratio,
        time_ratio_upper=pooled.upper,
        aa_time_ratio=pooled.aa,
        bb_time_ratio=pooled.bb,
        timed_batches=pooled.batches,
        errors=sum(r.errors for r in rows),
        dropped=sum(r.dropped for r in rows),
        canonical=s.key.canonical,
        hardware=s.key.hardware,
        phase=s.key.phase,
        seconds=sum(r.active_s for r in rows),
        batches=total,
        last_error=max(errs, key=lambda r: r.updated_at).last_error if errs else "",
        classes=classes,
        sampled=sum(r.batches for r in rows),
        compared=sum(r.batches - r.errors for r in rows),
        skipped_busy=sum(r.skipped for r in rows),
        busy_sampled=sum(r.busy for r in rows),
    )
    return judge(ev, g)


def judge(ev: ReleaseEvidence, g: Gates) -> ReleaseEvidence:
    """`ev` with every class and G1 / G2 judged again under `g` (recorded evidence is
    judged against today's gates)."""
    ev = replace(ev, classes=tuple(judge_class(c, g) for c in ev.classes))
    return replace(ev, passed_g1=passes_g1(ev, g), passed_g2=passes_g2(ev, g))


def _carried(ev: ReleaseEvidence, g: Gates) -> list[ClassEvidence]:
    return [c for c in ev.classes if carried(c, g)]


def passes_g1(ev: ReleaseEvidence, g: Gates) -> bool:
    """G1 agreement: no error anywhere; every class's worst vector and every carried
    class's mean in bounds; enough vectors and probes; overlap@10 in bounds."""
    judged = _carried(ev, g)
    return (
        bool(judged)
        and ev.errors == 0
        and ev.samples >= g.min_samples
        and ev.cosine_min >= g.min_cosine  # the worst vector of every class
        and all(class_g1(c, g) for c in judged)
        and ev.probes >= g.min_probes
        and ev.overlap_at_10 >= g.min_overlap
    )


def passes_g2(ev: ReleaseEvidence, g: Gates) -> bool:
    """G2 performance: every carried class timed enough, its A/A floor in bounds and its
    upper bound at most max_time_ratio."""
    judged = _carried(ev, g)
    return bool(judged) and all(class_g2(c, g) for c in judged)


def stable(ev: ReleaseEvidence, g: Gates) -> bool:
    """A release that passed G1 (which allows no shadow error) and G2."""
    return passes_g1(ev, g) and passes_g2(ev, g)


def g3_shortfall(ev: ReleaseEvidence, g: Gates, canonical: str, hardware: str) -> str:
    """Why G3 does not count `ev` for a decision about `canonical` on `hardware` ("" when
    it counts)."""
    if ev.canonical != canonical:
        return f"measured against {ev.canonical or 'an unnamed canonical'}, not {canonical}"
    if ev.hardware != hardware:
        return f"measured on {ev.hardware or 'an unnamed hardware class'}, not {hardware}"
    if ev.seconds < g.min_release_hours * 3600:
        return f"{ev.seconds / 3600:.1f} h of observed shadow time < {g.min_release_hours:g} h"
    if ev.compared < g.min_release_batches:
        return f"{ev.compared} compared batches < {g.min_release_batches}"
    if ev.batches and ev.dropped > g.max_drop_share * ev.batches:
        return (
            f"{ev.dropped} of {ev.batches} offered batches dropped (> {g.max_drop_share:.0%}): "
            "the evidence is a biased sample"
        )
    if not stable(ev, g):
        return "fails G1, G2 or had errors under today's gates"
    return ""


def _class_line(c: ClassEvidence, g: Gates, *, timing: bool) -> str:
    head = f"{c.name} ({LIMITS.get(c.name, '')}, {c.share:.0%} of batches)"
    if not c.carried:
        return f"{head}: not judged (under {g.min_class_share:.0%})"
    if timing:
        busy = c.busy_sampled / c.sampled if c.sampled else 0.0
        return (
            f"{head}: ratio={c.time_ratio:.3f} upper95={c.time_ratio_upper:.3f} "
            f"{_floors_line(c)} over {c.timed_batches} "
            f"batches; {busy:.0%} of samples under load, {c.skipped_busy} skipped busy"
        )
    return f"{head}: n={c.samples} min={c.cosine_min:.6f} mean={c.cosine_mean:.7f}"


def _g1_missing(cur: ReleaseEvidence, g: Gates) -> list[str]:
    miss = []
    if cur.errors:
        miss.append(f"no shadow errors ({cur.errors}; last: {cur.last_error})")
    if cur.samples < g.min_samples:
        miss.append(f"{g.min_samples - cur.samples} more compared vectors")
    for c in cur.classes:
        if c.samples and c.cosine_min < g.min_cosine:
            miss.append(f"{c.name}: min cosine >= {g.min_cosine}")
        elif c.carried and c.samples and c.cosine_mean < g.mean_cosine:
            miss.append(f"{c.name}: mean cosine >= {g.mean_cosine}")
    if not _carried(cur, g):
        miss.append("sampled traffic")
    if cur.probes < g.min_probes:
        miss.append(f"{g.min_probes - cur.probes} more probe queries")
    elif cur.overlap_at_10 < g.min_overlap:
        miss.append(f"overlap@10 >= {g.min_overlap}")
    return miss


def _g2_missing(cur: ReleaseEvidence, g: Gates) -> list[str]:
    miss = []
    for c in _carried(cur, g):
        if c.timed_batches < g.min_timed_batches:
            miss.append(f"{c.name}: {g.min_timed_batches - c.timed_batches} more timed batches")
        elif not floors_agree(c, g):
            miss.append(
                f"{c.name}: {_floors_line(c)}: the canonical's floor exceeds the shadow's "
                f"by more than {g.max_aa_ratio:g}x (the shadow slows the canonical after "
                "it), so these timings prove nothing"
            )
        elif c.time_ratio_upper > g.max_time_ratio:
            miss.append(
                f"{c.name}: upper bound {c.time_ratio_upper:.3f} <= {g.max_time_ratio} (the "
                f"shadow must get {c.time_ratio_upper / g.max_time_ratio:.2f}x faster)"
            )
        if not busy_covered(c, g):
            miss.append(
                f"{c.name}: busy traffic unmeasured ({c.busy_sampled} of "
                f"{c.busy_sampled + c.skipped_busy} batches offered under load sampled < "
                f"{g.min_busy_coverage:.0%})"
            )
    if not _carried(cur, g):
        miss.append("sampled traffic")
    return miss


def agreement_gate(cur: ReleaseEvidence, g: Gates) -> GateResult:
    return GateResult(
        "G1 agreement",
        cur.passed_g1,
        f"n={cur.samples} min={cur.cosine_min:.6f} p1={cur.cosine_p1:.6f} "
        f"mean={cur.cosine_mean:.7f} overlap@10={cur.overlap_at_10:.3f} ({cur.probes} probes)"
        f", errors={cur.errors}; "
        + "; ".join(_class_line(c, g, timing=False) for c in cur.classes),
        "; ".join(_g1_missing(cur, g)),
    )


def performance_gate(cur: ReleaseEvidence, g: Gates) -> GateResult:
    return GateResult(
        "G2 performance",
        cur.passed_g2,
        f"ratio={cur.time_ratio:.3f} upper95={cur.time_ratio_upper:.3f} "
        f"A/A={cur.aa_time_ratio:.3f} B/B={cur.bb_time_ratio:.3f} over {cur.timed_batches} "
        "batches (pooled); " + "; ".join(_class_line(c, g, timing=True) for c in cur.classes),
        "; ".join(_g2_missing(cur, g)),
    )


def stability_gate(
    cur: ReleaseEvidence,
    g: Gates,
    recorded: Sequence[ReleaseEvidence],
    hardware: str,
    barred: Mapping[str, str] = MappingProxyType({}),
    untrusted: Sequence[tuple[str, str]] = (),
) -> GateResult:
    """`barred`: release -> why its watch failed; `untrusted`: (release, why) of history
    entries whose signature did not verify, which `recorded` leaves out."""
    canonical = cur.canonical
    counted: dict[str, str] = {}
    refused: dict[str, str] = {name: f"entry refused: {why}" for name, why in untrusted}
    for r in recorded:
        why = (
            f"barred by its watch: {barred[r.shadow]}"
            if r.shadow in barred
            else g3_shortfall(r, g, canonical, hardware)
        )
        if why:
            refused.setdefault(r.shadow, why)
        else:
            counted[r.shadow] = "recorded"
    live_why = (
        f"barred by its watch: {barred[cur.shadow]}"
        if cur.shadow in barred
        else g3_shortfall(cur, g, canonical, hardware)
    )
    if not live_why:
        counted.setdefault(cur.shadow, "live")
    ok = len(counted) >= g.min_releases
    value = (
        f"{len(counted)} of {g.min_releases} releases passed G1+G2 with no errors against "
        f"{canonical} on {hardware}"
        + (f" ({', '.join(f'{k} {v}' for k, v in counted.items())})" if counted else "")
        + f"; {len(recorded)} recorded in the release history"
    )
    not_counted = {k: v for k, v in refused.items() if k not in counted}
    if not_counted:
        value += "; not counted: " + "; ".join(f"{k}: {v}" for k, v in not_counted.items())
    if live_why and cur.shadow not in counted:
        value += f"; live {cur.shadow}: {live_why}"
    missing = (
        ""
        if ok
        else f"{g.min_releases - len(counted)} more release(s) that pass, each over "
        f"{g.min_release_hours:g} h and {g.min_release_batches} batches, recorded and signed "
        "by a trusted server that measured them (`ragplane shadow record-release`)"
    )
    return GateResult("G3 stability", ok, value, missing)


def evaluate_gates(
    cur: ReleaseEvidence,
    g: Gates,
    recorded: Sequence[ReleaseEvidence] = (),
    hardware: str = "",
    barred: Mapping[str, str] = MappingProxyType({}),
    untrusted: Sequence[tuple[str, str]] = (),
) -> tuple[tuple[GateResult, ...], bool]:
    """G1 and G2 on the current shadow release's live evidence `cur`; G3 over the
    `recorded` releases (the committed history, entries that verified) judged against
    today's gates, plus `cur`. Returns the gates and whether the case is flip-eligible
    (all three pass and the watch never failed this release)."""
    gates = (
        agreement_gate(cur, g),
        performance_gate(cur, g),
        stability_gate(cur, g, recorded, hardware or cur.hardware, barred, untrusted),
    )
    return gates, all(x.passed for x in gates) and cur.shadow not in barred


def watch_verdict(ev: ReleaseEvidence, g: Gates) -> tuple[tuple[GateResult, ...], str]:
    """After a flip: the same G1 and G2 on the evidence since the flip. Returns the gates
    and why the case must unflip ("" while it holds). An error, a vector under
    min_cosine, a carried class's mean under mean_cosine once min_samples were compared,
    or a carried class whose G2 fails once it was timed min_timed_batches times (with a
    valid A/A floor) unflips; too little evidence does not."""
    g1, g2 = [], []
    if ev.errors:
        g1.append(f"{ev.errors} shadow error(s) (last: {ev.last_error})")
    for c in ev.classes:
        if c.samples and c.cosine_min < g.min_cosine:
            g1.append(f"{c.name}: a vector at cosine {c.cosine_min:.6f} < {g.min_cosine}")
        elif c.carried and ev.samples >= g.min_samples and c.cosine_mean < g.mean_cosine:
            g1.append(f"{c.name}: mean cosine {c.cosine_mean:.7f} < {g.mean_cosine}")
        if (
            c.carried
            and c.timed_batches >= g.min_timed_batches
            and floors_agree(c, g)
            and math.isfinite(c.time_ratio_upper)  # infinite: too few blocks to bound yet
            and c.time_ratio_upper > g.max_time_ratio
        ):
            g2.append(
                f"{c.name}: time ratio upper bound {c.time_ratio_upper:.3f} > "
                f"{g.max_time_ratio} over {c.timed_batches} batches"
            )
        if (
            c.carried
            and c.timed_batches >= g.watch_unproven_batches
            and not floors_agree(c, g)
        ):
            g2.append(
                f"{c.name}: timings still prove nothing after {c.timed_batches} batches "
                f"({_floors_line(c)}, beyond {g.max_aa_ratio:g}x)"
            )
    gates = (
        GateResult("watch G1", not g1, agreement_gate(ev, g).value, "; ".join(g1)),
        GateResult("watch G2", not g2, performance_gate(ev, g).value, "; ".join(g2)),
    )
    return gates, "; ".join(g1 + g2)
