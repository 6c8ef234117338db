"""The soak's verdict (bench.soak): what counts as a leak after warm-up, and that the data
the load stores is not one."""

from __future__ import annotations

from bench.soak import Sample, verdict


def _series(
    rss: list[float], fds: list[int], threads: list[int], data: list[float] | None = None
) -> list[Sample]:
    rows = zip(rss, fds, threads, data or [0.0] * len(rss), strict=True)
    return [Sample(30.0 * (i + 1), r, f, t, data_mb=d) for i, (r, f, t, d) in enumerate(rows)]


def test_a_steady_server_passes_and_warm_up_growth_is_ignored():
    s = _series([400, 600, 610, 615, 612], [40, 55, 55, 56, 55], [70, 90, 91, 90, 90])
    assert verdict(s, warm_up=60, failures=0) == []


def test_each_kind_of_growth_and_any_failure_fails():
    s = _series([600, 600, 640, 670], [50, 50, 60, 70], [90, 90, 95, 99])
    wrong = " ".join(verdict(s, warm_up=30, failures=3))
    assert "overhead (RSS less data) grew 11.7%" in wrong
    assert "open fds grew 50 -> 70" in wrong
    assert "threads grew 90 -> 99" in wrong
    assert "3 calls failed" in wrong


def test_too_short_a_run_is_not_a_pass():
    assert "too short" in verdict(_series([1], [1], [1]), warm_up=0, failures=0)[0]


def test_stored_vectors_are_data_not_overhead():
    # RSS +20% after warm-up, all of it vectors the load stored: a pass
    s = _series([500, 500, 550, 600], [40] * 4, [70] * 4, data=[0, 0, 50, 100])
    assert verdict(s, warm_up=30, failures=0) == []
    # the same RSS with less of it data: the overhead grew 12.5% and fails
    s = _series([500, 500, 550, 600], [40] * 4, [70] * 4, data=[100, 100, 100, 150])
    assert "grew 12.5%" in " ".join(verdict(s, warm_up=30, failures=0))
