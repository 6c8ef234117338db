"""The shadow manager: one experiment per declared case-of-use, the evidence it gathers,
the gates, and the flip.

It is the EmbeddingService's ShadowHook: `serving()` says which embedder answers a case,
`observe()` offers each answered batch to the case's experiment (sampled, queued, never
waited on). The experiment's worker embeds the same texts with the other embedder of the
pair; a share of samples is also timed on the same texts — canonical, shadow, canonical
and shadow, canonical, shadow in turn — so throughput is compared on identical batches,
unbiased by the order of the runs, with each side's A/A noise floor.

Every offered batch ends as evidence: compared, failed (an error the gates see), dropped
or skipped while busy (counted); a minimum share of the busy ones is sampled all the same.
Evidence is kept per traffic class and per phase: before a flip the gates decide whether
the case may flip; while the shadow serves, the same gates on its watch evidence unflip it
by themselves when it stops holding them, and so does a bad vector on the serving path
(`serving_failed`). A release whose watch failed is barred for good: its record stays.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ragplane.core.errors import FailedPrecondition, InvalidArgument
from ragplane.core.poller import Poller
from ragplane.server.embedding.base import Embedder
from ragplane.server.shadow.case import Batch, Case
from ragplane.server.shadow.classes import classify
from ragplane.server.shadow.compare import compare_rows
from ragplane.server.shadow.config import PairConfig
from ragplane.server.shadow.evidence import EvidenceKey, EvidenceStore
from ragplane.server.shadow.experiment import Experiment, Observation, Result
from ragplane.server.shadow.gates import watch_verdict
from ragplane.server.shadow.hardware import hardware_class
from ragplane.server.shadow.probes import ProbeSet
from ragplane.server.shadow.releases import (
    ReleaseHistory,
    ReleaseRecord,
    failing_reasons,
    record_from,
    sign,
)
from ragplane.server.shadow.signing import Signer
from ragplane.server.shadow.status import barred_releases, case_status, read_evidence
from ragplane.server.shadow.timing import run_interleaved
from ragplane.server.shadow.types import CaseStatus, ReleaseEvidence

log = logging.getLogger(__name__)
OVERLAP_EVERY = 10  # published samples between overlap@10 measurements
COMPATIBLE_TTL_S = 1.0  # longest compatible() trusts a G1 it read, without new evidence
FOLLOW_S = 0.5  # with a shared store: how often the stored flips are re-read


class ShadowManager:
    def __init__(
        self,
        pairs: dict[str, PairConfig],
        canonical: Embedder,
        shadows: dict[str, Embedder],
        store: EvidenceStore,
        *,
        queue_size: int = 64,
        seed: int | None = None,
        on_flip=None,  # callable(case, serving identity), e.g. to register an embedder
        # True while requests wait: the shadow then samples only its minimum share
        busy=lambda: False,
        history: ReleaseHistory | None = None,  # recorded releases, for G3
        unavailable: dict[str, str] | None = None,  # declared case -> why its shadow is off
        signer: Signer | None = None,  # signs the release entries this server records
    ) -> None:
        self.store = store
        self.signer = signer
        self.history = history or ReleaseHistory(None)
        self._canonical = canonical
        # declared pairs whose shadow cannot run: status says why, instead of nothing
        self.unavailable = {
            name: (pairs[name], why) for name, why in (unavailable or {}).items() if name in pairs
        }
        self._rng = random.Random(seed)
        self._on_flip = on_flip
        self._flipping = threading.RLock()  # a flip here, or one adopted from the store
        self.cases: dict[str, Case] = {}
        # One thread for A/B/A timings, started here at the priority of the thread that
        # builds the manager: a thread inherits its creator's nice value on Linux, so one
        # started lazily by a niced worker would be niced too.
        self._timing = ThreadPoolExecutor(1, thread_name_prefix="shadow-timing")
        self._timing.submit(lambda: None).result()
        for name, cfg in pairs.items():
            shadow = shadows.get(name)
            if shadow is None:
                continue
            persisted, forced = store.state(name)
            declared = shadow.identity if cfg.status == "flipped" else canonical.identity
            serving = persisted if persisted in (canonical.identity, shadow.identity) else declared
            case = Case(cfg, canonical, shadow, serving, hardware_class(canonical, shadow), forced)
            case.probes = ProbeSet(cfg.probe_corpus, random.Random(self._rng.random()))
            if cfg.status != "experimental":
                case.experiment = Experiment(
                    name,
                    candidate=lambda batch, control, c=case: self._candidate(c, batch, control),
                    compare=functools.partial(compare_rows, min_cosine=cfg.gates.min_cosine),
                    publisher=_Publisher(self, case),
                    sample_rate=cfg.sample_rate,
                    run_if=lambda _batch: not busy(),
                    min_share=cfg.min_busy_share,
                    stratum=lambda batch: batch.cls,
                    queue_size=queue_size,
                    rng=random.Random(self._rng.random()),
                    nice=19,
                )
            self.cases[name] = case
        # a shared store: flips made by the other servers of the cluster, adopted here
        self._follower = Poller("shadow flips", FOLLOW_S, self.refresh) if store.shared else None

    # -- ShadowHook ----------------------------------------------------------------------

    def serving(self, use_case: str) -> str | None:
        case = self.cases.get(use_case)
        return case.serving if case else None

    def observe(
        self,
        use_case: str,
        texts: Sequence[str],
        vectors: np.ndarray,
        seconds: float,
        embedder: str,
        tokens: Sequence[int] = (),
    ) -> None:
        """`tokens`: each text's token count, which puts the batch in its traffic class
        (counted with the canonical's tokenizer when not given)."""
        case = self.cases.get(use_case)
        if case is None or case.experiment is None:
            return
        cls = classify(tokens) if len(tokens) else None
        batch = Batch(list(texts), cls or "")
        case.experiment.offer(batch, Observation(embedder, vectors, None, seconds))

    def _key(self, case: Case) -> EvidenceKey:
        """Where a sample taken now is recorded: the watch while the shadow serves."""
        phase = "watch" if case.serving == case.shadow.identity else "shadow"
        return EvidenceKey(
            case.cfg.use_case, case.shadow.identity, case.canonical.identity, case.hardware, phase
        )

    def _class_of(self, case: Case, batch: Batch) -> str:
        return batch.cls or classify(case.canonical.count_tokens(batch.texts))

    # -- the experiment ------------------------------------------------------------------

    def _candidate(self, case: Case, batch: Batch, control: Observation):
        texts = batch.texts
        other = case.shadow if control.name == case.canonical.identity else case.canonical
        extra: dict = {}
        if self._rng.random() < case.cfg.timing_rate:
            # On the timing thread, not this niced worker: ONNX Runtime does part of its
            # work on the calling thread, embedder_rs all of it on its own pool, so timing
            # both from a nice-19 thread charged the canonical alone for the low priority
            # (measured on 2 cores: A/B/A ratio 0.09 niced vs 0.37 at normal priority).
            cls = self._class_of(case, batch)
            shadow_first = case.timed.get(cls, 0) % 2 == 1
            case.timed[cls] = case.timed.get(cls, 0) + 1
            shadow_vecs, canon_vecs, timing = self._timing.submit(
                lambda: run_interleaved(
                    # apart from the instance that serves (Embedder.timing_twin), made on
                    # this thread at the first timed batch
                    case.canonical.timing_twin(), case.shadow, texts, shadow_first,
                    case.cfg.timing_pause_ms / 1000,
                )
            ).result()  # fmt: skip
            extra["timing"] = timing
            value = shadow_vecs if other is case.shadow else canon_vecs
            # the middle run is the one embedder, the outer two the other
            middle_is_shadow = not timing[3]
            duration = timing[1] if (other is case.shadow) == middle_is_shadow else timing[2]
        else:
            t0 = time.perf_counter()
            value = other.embed(texts, normalize=False)
            duration = time.perf_counter() - t0
        return Observation(other.identity, value, None, duration), extra

    def _publish(self, case: Case, result: Result) -> None:
        case.g1 = None
        key, batch = self._key(case), result.inputs
        cls = self._class_of(case, batch)
        cand = result.candidates[0]
        if cand.error is not None:
            what = f"{type(cand.error).__name__}: {cand.error}"
            log.warning("shadow %s failed on %d texts: %s", cand.name, len(batch.texts), what)
            self.store.record_error(key, cls, what, busy=result.forced)
            self._decide(case)
            return
        self.store.record_agreement(key, cls, result.comparison.tolist(), busy=result.forced)
        if "timing" in result.extra:
            self.store.record_timing(key, cls, *result.extra["timing"])
        canon, shadow = (
            (result.control.value, cand.value)
            if result.control.name == case.canonical.identity
            else (cand.value, result.control.value)
        )
        case.probes.add(batch.texts, canon, shadow)
        case.published += 1
        if case.published % OVERLAP_EVERY == 0:
            self.measure_overlap(case.cfg.use_case)
        self._decide(case)

    def _decide(self, case: Case) -> None:
        """After each sample: the watch unflips a flipped case whose watch evidence fails
        a gate; `auto` flips an eligible one."""
        if case.serving == case.shadow.identity:
            if case.forced:
                return
            _, why = watch_verdict(self._watch_evidence(case), case.cfg.gates)
            if why:
                self._set_serving(case, case.canonical.identity, "unflip", False, f"watch: {why}")
            return
        if case.cfg.policy == "auto":
            st = self._status(case)
            if st.flip_eligible and not self._unflipped(st):
                self._set_serving(
                    case, case.shadow.identity, "flip", False, "automatic: every gate holds"
                )

    def serving_failed(
        self, use_case: str, embedder: str, texts: Sequence[str], tokens: Sequence[int], why: str
    ) -> None:
        """The serving path refused what `embedder` returned for `texts` (non-finite or
        misshapen vectors) and answered with the canonical. When `embedder` is the
        case's serving shadow: one watch error, recorded now whatever the sample rate,
        and the case unflipped (forced flip or not: a bad vector is never served twice)."""
        case = self.cases.get(use_case)
        if case is None or embedder != case.shadow.identity:
            return
        what = f"served output refused: {why}"
        log.error("%s: %s returned %s on %d texts", use_case, embedder, why, len(texts))
        key = EvidenceKey(*self._key(case).row()[:4], phase="watch")
        cls = classify(tokens) if len(tokens) else self._class_of(case, Batch(list(texts), ""))
        try:
            self.store.record_error(key, cls, what)
        finally:
            case.g1 = None
            if case.serving == embedder:
                try:
                    self._set_serving(
                        case, case.canonical.identity, "unflip", False, f"watch: {what}"
                    )
                except Exception:  # the store is away: this server stops serving it anyway
                    log.exception("%s: the unflip could not be stored", use_case)
                    case.serving, case.forced = case.canonical.identity, False

    @staticmethod
    def _unflipped(st: CaseStatus) -> bool:
        """An admin unflipped this very shadow release: `auto` must not flip it straight
        back on the next sample. A new release, or an admin flip, starts over."""
        h = st.history
        return (
            bool(h)
            and h[-1].action == "unflip"
            and any(e.action == "flip" and e.serving == st.shadow for e in h)
        )

    def measure_overlap(self, use_case: str) -> float:
        """overlap@10 of the case's probe set (server.shadow.probes), recorded."""
        case = self.cases[use_case]
        overlap, nq = case.probes.overlap(case.cfg.probe_queries)
        if nq:
            self.store.record_overlap(self._key(case), overlap, nq)
        return overlap

    # -- status and flip -----------------------------------------------------------------

    def _case(self, use_case: str) -> Case:
        case = self.cases.get(use_case)
        if case is None and use_case in self.unavailable:
            raise FailedPrecondition(
                f"the shadow of {use_case} does not run: {self.unavailable[use_case][1]}"
            )
        if case is None:
            raise InvalidArgument(
                f"no shadow pair for use case {use_case!r}; declared: "
                f"{', '.join(sorted(self.cases)) or 'none'}"
            )
        return case

    def _evidence(self, case: Case, phase: str) -> tuple[list[ReleaseEvidence], ReleaseEvidence]:
        return read_evidence(self.store, case, phase)

    def _watch_evidence(self, case: Case) -> ReleaseEvidence:
        return self._evidence(case, "watch")[1]

    def _status(self, case: Case) -> CaseStatus:
        return case_status(case, self.store, self.history)

    def _unavailable_status(self, name: str) -> CaseStatus:
        cfg, why = self.unavailable[name]
        return CaseStatus(
            use_case=name,
            status="unavailable",
            policy=cfg.policy,
            sample_rate=cfg.sample_rate,
            canonical=self._canonical.identity,
            shadow=cfg.shadow,
            serving=self._canonical.identity,
            reason=why,
        )

    def status(self, use_case: str | None = None) -> list[CaseStatus]:
        if use_case in self.unavailable:
            return [self._unavailable_status(use_case)]
        if use_case:
            return [self._status(self._case(use_case))]
        names = sorted([*self.cases, *self.unavailable])
        return [
            self._status(self.cases[n]) if n in self.cases else self._unavailable_status(n)
            for n in names
        ]

    def _set_serving(
        self, case: Case, serving: str, action: str, forced: bool, reason: str
    ) -> None:
        """A compare-and-set on the stored state: a flip only over the canonical, an unflip
        only over the shadow, so of two servers deciding at once one wins; the other
        adopts the winner's state. The watch evidence of earlier flips of the same release
        stays: a release's record is permanent."""
        name, shadow = case.cfg.use_case, case.shadow.identity
        other = case.canonical.identity if serving == shadow else shadow
        with self._flipping:
            if self._on_flip is not None:
                self._on_flip(name, serving)
            if not self.store.set_serving(name, serving, action, forced, reason, expect=other):
                self.refresh()
                return
            case.serving, case.forced = serving, forced
        log.warning("%s: %s -> %s now answers (%s)", name, action, serving, reason)

    def refresh(self) -> None:
        """Adopt what the store says answers each case (with a shared store: every
        FOLLOW_S, so a flip or unflip made on any server is served by all)."""
        for name, case in self.cases.items():
            with self._flipping:
                serving, forced = self.store.state(name)
                if serving not in (case.canonical.identity, case.shadow.identity):
                    continue
                if serving != case.serving:
                    if self._on_flip is not None:
                        self._on_flip(name, serving)
                    log.warning("%s: %s now answers (the cluster's flip)", name, serving)
                case.serving, case.forced = serving, forced

    def flip(self, use_case: str, *, force: bool = False) -> CaseStatus:
        case = self._case(use_case)
        st = self._status(case)
        if case.serving == case.shadow.identity:
            return st
        if not st.flip_eligible and not force:
            failing = [f"{g.name}: {g.missing or g.value}" for g in st.gates if not g.passed]
            if st.barred:
                why = f"the watch of {st.shadow} failed ({st.barred}); a new release is needed"
                failing.insert(0, why)
            raise FailedPrecondition(
                f"{use_case} is not flip-eligible: {'; '.join(failing)}. Use force to flip anyway"
            )
        reason = "forced by admin" if not st.flip_eligible else "every gate holds"
        self._set_serving(
            case, case.shadow.identity, "flip", force and not st.flip_eligible, reason
        )
        return self._status(case)

    def unflip(self, use_case: str) -> CaseStatus:
        case = self._case(use_case)
        if case.serving != case.canonical.identity:
            self._set_serving(case, case.canonical.identity, "unflip", False, "admin unflip")
        return self._status(case)

    def record_release(self, use_case: str) -> tuple[ReleaseRecord, bool]:
        """The live evidence of the case's current shadow release, judged under this
        server's gates, as an entry of the release history signed by this server's key
        (re-recording a release replaces its entry). Returns the entry and whether it
        replaced one. Refused (FailedPrecondition, with every reason) when the evidence
        fails G1 or G2 or had a shadow error, or the release's watch failed: the history
        holds only releases that passed."""
        case = self._case(use_case)
        if self.history.path is None:
            raise FailedPrecondition("this server has no release history file (koder_toml)")
        if self.signer is None:
            raise FailedPrecondition("this server has no signing key to sign release entries")
        barred = barred_releases(case, self._evidence(case, "watch")[0])
        if case.shadow.identity in barred:
            raise FailedPrecondition(
                f"{case.shadow.identity} is not recorded: its watch failed after a flip "
                f"({barred[case.shadow.identity]}); a new release is needed"
            )
        _, cur = self._evidence(case, "shadow")
        if not cur.batches:
            raise FailedPrecondition(f"no live evidence for {cur.shadow} yet; send traffic")
        why = failing_reasons(cur, case.cfg.gates)
        if why:
            raise FailedPrecondition(
                f"{cur.shadow} is not recorded: under this server's gates " + "; ".join(why)
            )
        rec = sign(record_from(use_case, cur, case.cfg.gates), self.signer)
        return rec, self.history.record(rec)

    def compatible(self, a: str, b: str) -> bool:
        """True when vectors of `a` and `b` may be mixed: the same embedder, or a declared
        pair whose current shadow release passes G1."""
        if a == b:
            return True
        for case in self.cases.values():
            if {a, b} == {case.canonical.identity, case.shadow.identity}:
                now, hit = time.monotonic(), case.g1
                if hit is None or now - hit[0] > COMPATIBLE_TTL_S:
                    hit = case.g1 = (now, self._status(case).gates[0].passed)
                return hit[1]
        return False

    def drain(self, timeout: float = 60.0) -> None:
        for case in self.cases.values():
            if case.experiment:
                case.experiment.drain(timeout)

    def close(self) -> None:
        if self._follower is not None:
            self._follower.close()
        for case in self.cases.values():
            if case.experiment:
                case.experiment.close()
        self._timing.shutdown()
        self.store.close()


class _Publisher:
    def __init__(self, manager: ShadowManager, case: Case) -> None:
        self._m = manager
        self._case = case

    def publish(self, result: Result) -> None:
        self._m._publish(self._case, result)

    def dropped(self, experiment: str, inputs: Batch) -> None:
        case = self._case
        self._m.store.record_drop(self._m._key(case), self._m._class_of(case, inputs))

    def skipped(self, experiment: str, inputs: Batch) -> None:
        case = self._case
        self._m.store.record_skip(self._m._key(case), self._m._class_of(case, inputs))
