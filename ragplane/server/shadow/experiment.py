"""A shadow experiment in the manner of github/scientist, but never inline.

The control has already answered the request (its value is what the caller gets); the
experiment decides whether to sample the call (`run_if`, `sample_rate`) and, if so, hands
the inputs and the control's observation to a bounded queue. One worker thread runs the
candidate there, off the request path, builds an immutable `Result` of `Observation`s,
applies `compare` / `ignore`, and hands it to the publisher. Nothing offered is lost
without a count: a full queue drops the sample and counts it; a candidate that raises, or
whose value `compare` cannot compare (it raises: NaN, a wrong shape or count), becomes an
observation with that error; a sample the publisher cannot record is counted as dropped.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import threading
import time
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


class Publisher(Protocol):
    def publish(self, result: Result[Any]) -> None: ...
    def dropped(self, experiment: str, inputs: Any) -> None: ...


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
    ) -> None:
        self.name = name
        self._candidate = candidate
        self._compare = compare
        self._publisher = publisher
        self.sample_rate = sample_rate
        self._run_if = run_if
        self._ignore = tuple(ignore)
        self._queue: queue.Queue[tuple[Any, Observation[T]] | None] = queue.Queue(queue_size)
        self._rng = rng or random.Random()
        self.enabled = True
        self._nice = nice
        self._thread = threading.Thread(target=self._work, name=f"shadow-{name}", daemon=True)
        self._thread.start()

    def offer(self, inputs: Any, control: Observation[T]) -> bool:
        """Called on the request path after the control answered. Never blocks; returns
        whether the call was sampled and queued."""
        if not self.enabled or self._rng.random() >= self.sample_rate:
            return False
        try:
            if not self._run_if(inputs):
                return False
        except Exception:  # a broken run_if must not break the request
            log.exception("run_if of experiment %s failed", self.name)
            return False
        try:
            self._queue.put_nowait((inputs, control))
            return True
        except queue.Full:
            self._drop(inputs)
            return False

    def _drop(self, inputs: Any) -> None:
        try:
            self._publisher.dropped(self.name, inputs)
        except Exception as exc:  # the request answered already; a lost count is not its fault
            log.warning("experiment %s could not count a dropped sample: %s", self.name, exc)

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

    def _run(self, inputs: Any, control: Observation[T]) -> None:
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
            Result(self.name, inputs, control, (cand,), comparison, matched, ignored, extra)
        )
