"""ShadowStatus of a running case: the evidence as stored, judged under the case's gates,
with the watch's record and the releases it bars."""

from __future__ import annotations

from collections.abc import Sequence

from ragplane.server.shadow.case import Case
from ragplane.server.shadow.evidence import EvidenceStore
from ragplane.server.shadow.gates import evaluate_gates, release_evidence, watch_verdict
from ragplane.server.shadow.releases import ReleaseHistory
from ragplane.server.shadow.types import CaseStatus, ReleaseEvidence


def read_evidence(
    store: EvidenceStore, case: Case, phase: str
) -> tuple[list[ReleaseEvidence], ReleaseEvidence]:
    """Every stored release of the case in `phase`, and the current one's evidence
    (the shadow as declared, against this canonical on this hardware class)."""
    g = case.cfg.gates
    releases = [release_evidence(s, g) for s in store.stored(case.cfg.use_case, phase)]
    mine = (case.shadow.identity, case.canonical.identity, case.hardware)
    cur = next(
        (r for r in releases if (r.shadow, r.canonical, r.hardware) == mine),
        ReleaseEvidence(shadow=mine[0], canonical=mine[1], hardware=mine[2], phase=phase),
    )
    return releases, cur


def barred_releases(case: Case, watch: Sequence[ReleaseEvidence]) -> dict[str, str]:
    """Releases (of this case, against this canonical) whose watch failed, and why:
    the record is permanent, so the bar holds until a new release."""
    g = case.cfg.gates
    out = {}
    for ev in watch:
        if ev.canonical == case.canonical.identity:
            why = watch_verdict(ev, g)[1]
            if why:
                out[ev.shadow] = why
    return out


def case_status(case: Case, store: EvidenceStore, history: ReleaseHistory) -> CaseStatus:
    """What ShadowStatus says of a running case: its gates on the live evidence, the
    watch's record and the bar it sets, flip history."""
    g = case.cfg.gates
    releases, cur = read_evidence(store, case, "shadow")
    watch_releases, watching = read_evidence(store, case, "watch")
    barred = barred_releases(case, watch_releases)
    recorded, untrusted = history.verified(case.cfg.use_case)
    gates, eligible = evaluate_gates(
        cur, g, [r.evidence for r in recorded], case.hardware, barred, untrusted
    )
    flipped = case.serving == case.shadow.identity
    watch = watch_verdict(watching, g)[0] if flipped or watching.batches else ()
    return CaseStatus(
        use_case=case.cfg.use_case,
        status="flipped"
        if flipped
        else ("shadow-active" if case.cfg.status == "flipped" else case.cfg.status),
        policy=case.cfg.policy,
        sample_rate=case.cfg.sample_rate,
        canonical=case.canonical.identity,
        shadow=case.shadow.identity,
        serving=case.serving,
        gates=gates,
        flip_eligible=eligible,
        releases=tuple(releases),
        history=tuple(store.history(case.cfg.use_case)),
        hardware=case.hardware,
        kernel=str(getattr(case.shadow, "kernel", "") or ""),
        watch=watch,
        barred=barred.get(case.shadow.identity, ""),
        watch_releases=tuple(watch_releases),
    )
