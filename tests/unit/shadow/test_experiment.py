"""The experiment object: the control's value is what callers keep; the candidate runs on
the worker; full queues drop and count; errors become observations."""

from __future__ import annotations

import threading

import pytest

from ragplane.server.shadow.experiment import Experiment, Observation


class FakePublisher:
    def __init__(self) -> None:
        self.results = []
        self.drops = 0
        self.skips = []

    def publish(self, result) -> None:
        self.results.append(result)

    def dropped(self, experiment: str, inputs) -> None:
        self.drops += 1

    def skipped(self, experiment: str, inputs) -> None:
        self.skips.append(inputs)


def make(pub, candidate, **kw):
    return Experiment(
        "t", candidate=candidate, compare=lambda a, b: (a == b, a == b), publisher=pub, **kw
    )


def test_candidate_runs_off_thread_and_results_are_immutable():
    pub = FakePublisher()
    threads = []

    def cand(inputs, control):
        threads.append(threading.current_thread().name)
        return Observation("candidate", inputs * 2, None, 0.01), {"k": 1}

    e = make(pub, cand)
    control = Observation("control", 4, None, 0.02)
    assert e.offer(2, control)
    e.drain()
    e.close()
    (r,) = pub.results
    assert r.control is control and r.candidates[0].value == 4 and r.matched and r.extra == {"k": 1}
    assert threads == ["shadow-t"]
    with pytest.raises(AttributeError):
        r.matched = False  # frozen


def test_sample_rate_and_run_if():
    pub = FakePublisher()
    e = make(pub, lambda i, c: (Observation("c", i, None, 0), {}), sample_rate=0.0)
    assert not e.offer(1, Observation("control", 1, None, 0))
    e.sample_rate = 1.0
    e._run_if = lambda inputs: inputs != "skip"
    assert not e.offer("skip", Observation("control", 1, None, 0))
    assert pub.skips == ["skip"]  # refused by run_if: counted, never silent
    assert e.offer("go", Observation("control", "go", None, 0))
    e.drain()
    e.close()
    assert len(pub.results) == 1


def test_full_queue_drops_and_counts_without_blocking():
    pub = FakePublisher()
    gate = threading.Event()

    def slow(i, c):
        gate.wait(5)
        return Observation("c", i, None, 0), {}

    e = make(pub, slow, queue_size=2)
    offered = [e.offer(i, Observation("control", i, None, 0)) for i in range(10)]
    gate.set()
    e.drain()
    e.close()
    assert pub.drops == 10 - sum(offered) and pub.drops >= 7
    assert len(pub.results) == sum(offered)


def test_candidate_error_is_an_observation_and_ignore_rules_apply():
    pub = FakePublisher()

    def boom(i, c):
        raise RuntimeError("shadow broke")

    e = make(pub, boom, ignore=[lambda control, cand: cand.error is not None])
    e.offer(1, Observation("control", 1, None, 0))
    e.drain()
    e.close()
    (r,) = pub.results
    assert isinstance(r.candidates[0].error, RuntimeError) and not r.matched and r.ignored


def test_a_value_compare_cannot_compare_is_the_candidates_error():
    pub = FakePublisher()

    def strict(a, b):
        if b is None:
            raise ValueError("nothing to compare")
        return a == b, a == b

    e = Experiment(
        "t",
        candidate=lambda i, c: (Observation("c", None, None, 0.0), {}),
        compare=strict,
        publisher=pub,
    )
    e.offer(1, Observation("control", 1, None, 0))
    e.drain()
    e.close()
    (r,) = pub.results
    assert isinstance(r.candidates[0].error, ValueError) and r.comparison is None


def test_a_result_the_publisher_cannot_take_is_counted_as_dropped():
    class Failing(FakePublisher):
        def publish(self, result) -> None:
            raise RuntimeError("store broke")

    pub = Failing()
    e = make(pub, lambda i, c: (Observation("c", i, None, 0), {}))
    for i in range(3):
        e.offer(i, Observation("control", i, None, 0))
    e.drain()
    e.close()
    assert pub.drops == 3


def test_a_minimum_share_of_what_run_if_refuses_runs_anyway_per_stratum():
    pub = FakePublisher()
    e = make(
        pub,
        lambda i, c: (Observation("c", i, None, 0), {}),
        run_if=lambda inputs: False,  # always busy
        min_share=0.2,
        stratum=lambda inputs: inputs[0],
    )
    offers = [("a", i) for i in range(50)] + [("b", i) for i in range(10)]
    queued = [x for x in offers if e.offer(x, Observation("control", x, None, 0))]
    e.drain()
    e.close()
    for stratum, n in (("a", 50), ("b", 10)):
        ran = [r for r in pub.results if r.inputs[0] == stratum]
        skipped = [x for x in pub.skips if x[0] == stratum]
        assert len(ran) + len(skipped) == n  # every refused call ran or was counted
        assert len(ran) >= 0.2 * n and len(ran) <= 0.2 * n + 1  # the share, not more
        assert all(r.forced for r in ran)
    assert len(queued) == len(pub.results)
    # without a minimum share nothing refused runs, and all of it is counted
    pub2 = FakePublisher()
    e2 = make(pub2, lambda i, c: (Observation("c", i, None, 0), {}), run_if=lambda x: False)
    assert not any(e2.offer(i, Observation("control", i, None, 0)) for i in range(20))
    e2.close()
    assert len(pub2.skips) == 20 and not pub2.results
