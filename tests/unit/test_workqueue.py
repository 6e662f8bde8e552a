"""controller/workqueue.py: a key is queued once, handed to one drainer at a time, and never lost."""
from __future__ import annotations

import threading

from coderun_operator.controller.workqueue import WorkQueue


def test_a_key_added_twice_is_processed_once_in_the_order_first_added() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for key in ("b", "a", "b", "c", "a"):
        queue.add(key)
    seen: list[str] = []
    queue.drain(seen.append)
    assert seen == ["b", "a", "c"]
    assert len(queue) == 0 and queue.pop() is None


def test_a_key_added_while_it_is_processed_is_processed_again_after() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("ns")
    seen: list[str] = []

    def process(key: str) -> None:
        seen.append(key)
        if len(seen) == 1:
            queue.add(key)  # e.g. a run finished while its namespace's queue was being looked at
            assert queue.pop() is None  # not handed out while it is being processed

    queue.drain(process)
    assert seen == ["ns", "ns"]


def test_a_key_being_processed_is_not_handed_to_a_second_drainer() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("ns")
    inside, release = threading.Event(), threading.Event()
    seen: list[str] = []

    def slow(key: str) -> None:
        seen.append(key)
        inside.set()
        assert release.wait(10)

    first = threading.Thread(target=queue.drain, args=(slow,))
    first.start()
    assert inside.wait(10)
    queue.add("ns")
    queue.add("other")
    queue.drain(seen.append)  # a second drainer meanwhile: takes "other", leaves "ns" to the first
    assert seen == ["ns", "other"]
    release.set()
    first.join(10)
    assert seen == ["ns", "other", "ns"]  # the first drainer processed it again once its first pass was done


def test_a_failing_process_leaves_the_key_free_for_the_next_add() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("ns")

    def boom(key: str) -> None:
        raise RuntimeError(key)

    try:
        queue.drain(boom)
    except RuntimeError:
        pass
    assert "ns" not in queue
    queue.add("ns")
    seen: list[str] = []
    queue.drain(seen.append)
    assert seen == ["ns"]
