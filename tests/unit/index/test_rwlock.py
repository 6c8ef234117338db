"""The collection's readers-writer lock: readers share it, a writer has it alone, and a
waiting writer holds back new readers (searches cannot starve a FAISS add or a swap)."""

from __future__ import annotations

import threading
import time

from ragplane.index.state import RWLock


def _started(target) -> threading.Thread:
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def test_readers_share_the_lock():
    rw = RWLock()
    both_in = threading.Barrier(2, timeout=5)

    def reader():
        with rw.read():
            both_in.wait()  # breaks (raises) unless the other reader is inside too

    threads = [_started(reader) for _ in range(2)]
    for t in threads:
        t.join(5)
    assert not both_in.broken


def test_a_writer_waits_for_readers_and_holds_back_new_ones():
    rw = RWLock()
    order: list[str] = []
    first_in, release_first = threading.Event(), threading.Event()

    def first_reader():
        with rw.read():
            first_in.set()
            release_first.wait(5)
            order.append("reader 1 out")

    def writer():
        with rw.write():
            order.append("writer")

    def late_reader():
        with rw.read():
            order.append("reader 2")

    r1 = _started(first_reader)
    assert first_in.wait(5)
    w = _started(writer)
    while rw._waiting == 0:  # the writer is queued behind reader 1
        time.sleep(0.001)
    r2 = _started(late_reader)
    time.sleep(0.05)
    assert order == []  # neither the writer nor the reader behind it got in
    release_first.set()
    for t in (r1, w, r2):
        t.join(5)
    assert order == ["reader 1 out", "writer", "reader 2"]


def test_writers_exclude_each_other_and_the_lock_is_free_after():
    rw = RWLock()
    inside = 0
    most = 0
    mu = threading.Lock()

    def writer():
        nonlocal inside, most
        for _ in range(200):
            with rw.write():
                with mu:
                    inside += 1
                    most = max(most, inside)
                time.sleep(0)
                with mu:
                    inside -= 1

    threads = [_started(writer) for _ in range(4)]
    for t in threads:
        t.join(10)
    assert most == 1
    with rw.write():  # nobody left holding it
        pass
    with rw.read():
        pass
