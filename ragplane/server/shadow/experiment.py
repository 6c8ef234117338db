"""A shadow experiment in the manner of github/scientist, but never inline.

The control has already answered the request (its value is what the caller gets); the
experiment decides whether to sample the call (`run_if`, `sample_rate`) and, if so, hands
the inputs and the control's observation to a bounded queue. One worker thread runs the
candidate there, off the request path, builds an immutable `Result` of `Observation`s,
applies `compare` / `ignore`, and hands it to the publisher. Nothing offered is lost
without a count: a full queue drops the sample and counts it; a candidate that raises, or
whose value `compare` cannot compare (it raises: NaN, a wrong shape or count), becomes an
observation with that error; a sample the publisher cannot record is counted as dropped.

`run_if` refusing a call (the server is busy, say) is no way out of the evidence either:
the refusal is counted (`Publisher.skipped`), and at least `min_share` of the refused
calls of each stratum run all the same (`Result.forced`), so the evidence covers the
hours when run_if says no: under sustained load, the regime an experiment most needs to
see, rather than only the quiet ones.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

from ragplane.core.errors import RagplaneError

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Observation(Generic[T]):
    name: str  # which behaviour: "control" / "candidate" / an embedder identity
    value: T | None
    error: BaseException | None
    duration: float  # seconds


@dataclass(frozen=True)
class Result(Generic[T]):
    experiment: str
    inputs: Any
    control: Observation[T]
    candidates: tuple[Observation[T], ...]
    comparison: Any  # what `compare` returned (e.g. per-vector cosines)
    matched: bool
    ignored: bool
    extra: dict[str, Any]  # what `run_candidate` measured besides (e.g. timings)
    forced: bool = False  # run although run_if said no (the minimum share under load)


class Publisher(Protocol):
    def publish(self, result: Result[Any]) -> None: ...
    def dropped(self, experiment: str, inputs: Any) -> None: ...
    def skipped(self, experiment: str, inputs: Any) -> None:
        """A call run_if refused and the minimum share did not take (counted, not run)."""
        ...


class Experiment(Generic[T]):
    def __init__(
        self,
        name: str,
        *,
        candidate: Callable[[Any, Observation[T]], tuple[Observation[T], dict[str, Any]]],
        compare: Callable[[T, T], tuple[Any, bool]],
        publisher: Publisher,
        sample_rate: float = 1.0,
        run_if: Callable[[Any], bool] = lambda inputs: True,
        ignore: Sequence[Callable[[Observation[T], Observation[T]], bool]] = (),
        queue_size: int = 64,
        rng: random.Random | None = None,
        nice: int = 0,
        min_share: float = 0.0,
        stratum: Callable[[Any], str] = lambda inputs: "",
    ) -> None:
        """`min_share`: of the sampled calls that `run_if` refuses, the share that runs all
        the same, per `stratum` of the inputs (a traffic class, say)."""
        self.name = name
        self._candidate = candidate
        self._compare = compare
        self._publisher = publisher
        self.sample_rate = sample_rate
        self._run_if = run_if
        self._ignore = tuple(ignore)
        self.min_share = min_share
        self._stratum = stratum
        self._refused: Counter[str] = Counter()  # per stratum: calls run_if refused
        self._forced: Counter[str] = Counter()  # of those, run all the same
        self._count_lock = threading.Lock()
        self._queue: queue.Queue[tuple[Any, Observation[T], bool] | None] = queue.Queue(queue_size)
        self._rng = rng or random.Random()
        self.enabled = True
        self._nice = nice
        self._thread = threading.Thread(target=self._work, name=f"shadow-{name}", daemon=True)
        self._thread.start()

    def offer(self, inputs: Any, control: Observation[T]) -> bool:
        """Called on the request path after the control answered. Never blocks; returns
        whether the call was sampled and queued. A sampled call ends queued, skipped
        (counted) or dropped (counted)."""
        if not self.enabled or self._rng.random() >= self.sample_rate:
            return False
        try:
            run = bool(self._run_if(inputs))
        except Exception:  # a broken run_if must not break the request
            log.exception("run_if of experiment %s failed", self.name)
            run = False
        stratum = None
        if not run:
            stratum = self._take_refused(inputs)
            if stratum is None:
                self._count(self._publisher.skipped, inputs)
                return False
        try:
            self._queue.put_nowait((inputs, control, stratum is not None))
        except queue.Full:
            self._drop(inputs)
            return False
        if stratum is not None:  # the share counts samples queued, not attempts dropped
            with self._count_lock:
                self._forced[stratum] += 1
        return True

    def _take_refused(self, inputs: Any) -> str | None:
        """The stratum of a call run_if refused when it runs all the same (while fewer
        than min_share of its stratum's refused calls were queued), else None."""
        try:
            stratum = self._stratum(inputs)
        except Exception:
            log.exception("stratum of experiment %s failed", self.name)
            stratum = ""
        with self._count_lock:
            self._refused[stratum] += 1
            if self._forced[stratum] < self.min_share * self._refused[stratum]:
                return stratum
        return None

    def _count(self, what: Callable[[str, Any], None], inputs: Any) -> None:
        try:
            what(self.name, inputs)
        except Exception as exc:  # the request answered already; a lost count is not its fault
            log.warning("experiment %s could not count a sample: %s", self.name, exc)

    def _drop(self, inputs: Any) -> None:
        self._count(self._publisher.dropped, inputs)

    def drain(self, timeout: float = 30.0) -> None:
        """Wait until every queued sample has been published (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)

    def _work(self) -> None:
        if self._nice:
            # Linux schedules threads individually: the candidate gets the CPU only when
            # the threads answering requests do not want it.
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self._nice)
            except (AttributeError, OSError):
                log.info("cannot lower the priority of the %s shadow worker", self.name)
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._run(*item)
            except RagplaneError as exc:  # a full or read-only disk: counted as dropped
                log.warning("shadow experiment %s could not record a sample: %s", self.name, exc)
                self._drop(item[0])
            except Exception:  # the worker must survive anything; the sample is counted
                log.exception("shadow experiment %s failed to publish", self.name)
                self._drop(item[0])
            finally:
                self._queue.task_done()

    def _run(self, inputs: Any, control: Observation[T], forced: bool) -> None:
        try:
            cand, extra = self._candidate(inputs, control)
        except Exception as exc:
            cand, extra = Observation("candidate", None, exc, 0.0), {}
        comparison, matched = None, False
        if cand.error is None and control.error is None:
            try:
                comparison, matched = self._compare(control.value, cand.value)  # type: ignore[arg-type]
            except Exception as exc:  # a value that cannot be compared is the candidate's fault
                cand = replace(cand, error=exc)
        ignored = any(rule(control, cand) for rule in self._ignore)
        self._publisher.publish(
            Result(self.name, inputs, control, (cand,), comparison, matched, ignored, extra, forced)
        )
