"""The shadow manager: one experiment per declared case-of-use, the evidence it gathers,
the gates, and the flip.

It is the EmbeddingService's ShadowHook: `serving()` says which embedder answers a case,
`observe()` offers each answered batch to the case's experiment (sampled, queued, never
waited on). The experiment's worker embeds the same texts with the other embedder of the
pair; a share of samples is also timed A/B/A on the same texts — canonical, shadow,
canonical — so throughput is compared on identical batches with an A/A noise floor.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from core.errors import FailedPrecondition, InvalidArgument
from server.embedding.base import Embedder, l2_normalize
from server.shadow.config import PairConfig
from server.shadow.evidence import EvidenceStore, evaluate_gates
from server.shadow.experiment import Experiment, Observation, Result
from server.shadow.releases import ReleaseHistory
from server.shadow.types import CaseStatus

log = logging.getLogger(__name__)
OVERLAP_EVERY = 10  # published samples between overlap@10 measurements
COMPATIBLE_TTL_S = 1.0  # longest compatible() trusts a G1 it read, without new evidence


@dataclass
class _Case:
    cfg: PairConfig
    canonical: Embedder
    shadow: Embedder
    serving: str
    experiment: Experiment | None = None
    probes: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    published: int = 0
    # G1 as (checked at, passed), so compatible() -- run on every text search of a
    # collection whose embedder differs from the serving one -- reads the evidence store
    # at most once per COMPATIBLE_TTL_S; new evidence clears it
    g1: tuple[float, bool] | None = None


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
        busy=lambda: False,  # True while requests wait: the shadow then takes no samples
        history: ReleaseHistory | None = None,  # recorded releases, for G3
        unavailable: dict[str, str] | None = None,  # declared case -> why its shadow is off
    ) -> None:
        self.store = store
        self.history = history or ReleaseHistory(None)
        self._canonical = canonical
        # declared pairs whose shadow cannot run: status says why, instead of nothing
        self.unavailable = {
            name: (pairs[name], why) for name, why in (unavailable or {}).items() if name in pairs
        }
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._on_flip = on_flip
        self.cases: dict[str, _Case] = {}
        # One thread for A/B/A timings, started here at the priority of the thread that
        # builds the manager: a thread inherits its creator's nice value on Linux, so one
        # started lazily by a niced worker would be niced too.
        self._timing = ThreadPoolExecutor(1, thread_name_prefix="shadow-timing")
        self._timing.submit(lambda: None).result()
        for name, cfg in pairs.items():
            shadow = shadows.get(name)
            if shadow is None:
                continue
            persisted = store.serving(name)
            declared = shadow.identity if cfg.status == "flipped" else canonical.identity
            serving = persisted if persisted in (canonical.identity, shadow.identity) else declared
            case = _Case(cfg, canonical, shadow, serving)
            if cfg.status != "experimental":
                case.experiment = Experiment(
                    name,
                    candidate=lambda texts, control, c=case: self._candidate(c, texts, control),
                    compare=functools.partial(self._compare, min_cosine=cfg.gates.min_cosine),
                    publisher=_Publisher(self, case),
                    sample_rate=cfg.sample_rate,
                    run_if=lambda _texts: not busy(),
                    queue_size=queue_size,
                    rng=random.Random(self._rng.random()),
                    nice=19,
                )
            self.cases[name] = case

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
    ) -> None:
        case = self.cases.get(use_case)
        if case is None or case.experiment is None:
            return
        case.experiment.offer(list(texts), Observation(embedder, vectors, None, seconds))

    # -- the experiment ------------------------------------------------------------------

    def _candidate(self, case: _Case, texts: list[str], control: Observation):
        other = case.shadow if control.name == case.canonical.identity else case.canonical
        extra: dict = {}
        if self._rng.random() < case.cfg.timing_rate:
            # On the timing thread, not this niced worker: ONNX Runtime does part of its
            # work on the calling thread, embedder_rs all of it on its own pool, so timing
            # both from a nice-19 thread charged the canonical alone for the low priority
            # (measured on 2 cores: A/B/A ratio 0.09 niced vs 0.37 at normal priority).
            shadow_vecs, canon_vecs, timing = self._timing.submit(self._aba, case, texts).result()
            extra["timing"] = timing
            value = shadow_vecs if other is case.shadow else canon_vecs
            duration = timing[1] if other is case.shadow else timing[2]
        else:
            t0 = time.perf_counter()
            value = other.embed(texts, normalize=False)
            duration = time.perf_counter() - t0
        return Observation(other.identity, value, None, duration), extra

    @staticmethod
    def _aba(case: _Case, texts: list[str]):
        """A/B/A on the very same texts: canonical, shadow, canonical."""
        t0 = time.perf_counter()
        case.canonical.embed(texts, normalize=False)
        t1 = time.perf_counter()
        shadow_vecs = case.shadow.embed(texts, normalize=False)
        t2 = time.perf_counter()
        canon_vecs = case.canonical.embed(texts, normalize=False)
        t3 = time.perf_counter()
        return shadow_vecs, canon_vecs, (t1 - t0, t2 - t1, t3 - t2)

    @staticmethod
    def _compare(control: np.ndarray, candidate: np.ndarray, *, min_cosine: float):
        """Per-row cosine, and whether the batch holds the case's G1 floor."""
        a, b = l2_normalize(np.asarray(control)), l2_normalize(np.asarray(candidate))
        cos = np.clip(np.sum(a * b, axis=1, dtype=np.float64), -1.0, 1.0)
        return cos, bool(cos.min() >= min_cosine)

    def _publish(self, case: _Case, result: Result) -> None:
        case.g1 = None
        release = case.shadow.identity
        cand = result.candidates[0]
        if cand.error is not None:
            log.warning(
                "shadow %s failed on %d texts: %s", cand.name, len(result.inputs), cand.error
            )
            self.store.record_error(case.cfg.use_case, release)
            return
        self.store.record_agreement(case.cfg.use_case, release, result.comparison.tolist())
        if "timing" in result.extra:
            self.store.record_timing(case.cfg.use_case, release, *result.extra["timing"])
        canon, shadow = (
            (result.control.value, cand.value)
            if result.control.name == case.canonical.identity
            else (cand.value, result.control.value)
        )
        self._add_probes(case, result.inputs, canon, shadow)
        case.published += 1
        if case.published % OVERLAP_EVERY == 0:
            self.measure_overlap(case.cfg.use_case)
        if case.cfg.policy == "auto" and case.serving != case.shadow.identity:
            st = self._status(case)
            if st.flip_eligible and not self._unflipped(st):
                self._set_serving(
                    case, case.shadow.identity, "flip", False, "automatic: every gate holds"
                )

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

    def _add_probes(self, case: _Case, texts, canon: np.ndarray, shadow: np.ndarray) -> None:
        cap = case.cfg.probe_corpus
        with self._lock:
            for t, c, s in zip(texts, l2_normalize(canon), l2_normalize(shadow), strict=True):
                if t in case.probes or not t.strip():
                    continue
                if len(case.probes) >= cap:  # reservoir: replace a random one
                    victim = self._rng.choice(list(case.probes))
                    del case.probes[victim]
                case.probes[t] = (c, s)

    def measure_overlap(self, use_case: str) -> float:
        """overlap@10: each probe query searched over the probe corpus with each embedder's
        own vectors (exact search, the query itself left out)."""
        case = self.cases[use_case]
        with self._lock:
            items = list(case.probes.values())
        if len(items) < 12:
            return 0.0
        canon = np.stack([c for c, _ in items])
        shadow = np.stack([s for _, s in items])
        nq = min(case.cfg.probe_queries, len(items))
        total = 0.0
        for i in range(nq):
            sc, ss = canon @ canon[i], shadow @ shadow[i]
            sc[i] = ss[i] = -np.inf
            top_c = set(np.argpartition(-sc, 10)[:10].tolist())
            top_s = set(np.argpartition(-ss, 10)[:10].tolist())
            total += len(top_c & top_s) / 10
        overlap = total / nq
        self.store.record_overlap(use_case, case.shadow.identity, overlap, nq)
        return overlap

    # -- status and flip -----------------------------------------------------------------

    def _case(self, use_case: str) -> _Case:
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

    def _status(self, case: _Case) -> CaseStatus:
        g = case.cfg.gates
        releases = self.store.releases(case.cfg.use_case, g)
        recorded = [r.evidence for r in self.history.records(case.cfg.use_case)]
        gates, eligible = evaluate_gates(releases, case.shadow.identity, g, recorded)
        flipped = case.serving == case.shadow.identity
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
            history=tuple(self.store.history(case.cfg.use_case)),
        )

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
        self, case: _Case, serving: str, action: str, forced: bool, reason: str
    ) -> None:
        if self._on_flip is not None:
            self._on_flip(case.cfg.use_case, serving)
        self.store.set_serving(case.cfg.use_case, serving, action, forced, reason)
        case.serving = serving
        log.warning("%s: %s -> %s now answers (%s)", case.cfg.use_case, action, serving, reason)

    def flip(self, use_case: str, *, force: bool = False) -> CaseStatus:
        case = self._case(use_case)
        st = self._status(case)
        if case.serving == case.shadow.identity:
            return st
        if not st.flip_eligible and not force:
            failing = "; ".join(
                f"{g.name}: {g.missing or g.value}" for g in st.gates if not g.passed
            )
            raise FailedPrecondition(
                f"{use_case} is not flip-eligible: {failing}. Use force to flip anyway"
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
        for case in self.cases.values():
            if case.experiment:
                case.experiment.close()
        self._timing.shutdown()
        self.store.close()


class _Publisher:
    def __init__(self, manager: ShadowManager, case: _Case) -> None:
        self._m = manager
        self._case = case

    def publish(self, result: Result) -> None:
        self._m._publish(self._case, result)

    def dropped(self, experiment: str) -> None:
        self._m.store.record_drop(experiment, self._case.shadow.identity)
