"""The simulator's event queue: time order, ties in scheduling order, cancellation."""

from collections.abc import Callable

from gpuguard.sim.events import EventQueue


def _recording() -> tuple[EventQueue, list[tuple[float, str]], Callable[[str], None]]:
    """A queue, what ran on it (when, what), and the action that notes a run."""
    queue = EventQueue()
    ran: list[tuple[float, str]] = []
    return queue, ran, lambda name: ran.append((queue.now, name))


def test_events_run_in_time_order_and_ties_in_the_order_scheduled():
    queue, ran, note = _recording()
    queue.at(5.0, note, "late")
    queue.at(1.0, note, "first at 1")
    queue.at(1.0, note, "second at 1")
    queue.at(3.0, lambda: queue.at(1.0, note, "in the past runs now"))
    queue.run(10.0)
    assert ran == [
        (1.0, "first at 1"),
        (1.0, "second at 1"),
        (3.0, "in the past runs now"),
        (5.0, "late"),
    ]
    assert queue.now == 10.0


def test_an_event_scheduled_now_runs_after_the_ones_already_due_now():
    queue, ran, note = _recording()
    queue.at(2.0, lambda: queue.at(2.0, note, "scheduled at 2"))
    queue.at(2.0, note, "due at 2")
    queue.run(10.0)
    assert ran == [(2.0, "due at 2"), (2.0, "scheduled at 2")]


def test_the_run_stops_at_its_end_and_leaves_later_events_unrun():
    queue, ran, note = _recording()
    queue.at(4.0, note, "in time")
    queue.at(4.5, note, "too late")
    queue.run(4.0)
    assert ran == [(4.0, "in time")]
    assert queue.now == 4.0


def test_a_cancelled_event_does_not_run_and_the_others_keep_their_order():
    queue, ran, note = _recording()
    queue.at(1.0, note, "a")
    stale = queue.at(1.0, note, "stale")
    queue.at(1.0, note, "b")
    queue.cancel(stale)
    queue.cancel(stale)  # twice is once
    queue.run(2.0)
    assert ran == [(1.0, "a"), (1.0, "b")]


def test_an_event_can_cancel_a_later_one_due_at_the_same_time():
    queue, ran, note = _recording()
    queue.at(1.0, lambda: queue.cancel(later))
    later = queue.at(1.0, note, "cancelled")
    queue.at(1.0, note, "kept")
    queue.run(2.0)
    assert ran == [(1.0, "kept")]


def test_cancelling_an_event_that_has_run_changes_nothing():
    queue, ran, note = _recording()
    done = queue.at(1.0, note, "ran")
    queue.at(1.0, lambda: queue.cancel(done))  # same time, just after it
    queue.at(2.0, lambda: queue.cancel(done))
    itself: list[tuple] = []
    itself.append(queue.at(3.0, lambda: queue.cancel(itself[0])))
    queue.at(3.0, note, "after")
    queue.run(5.0)
    assert ran == [(1.0, "ran"), (3.0, "after")]


def test_progress_hears_the_share_of_the_run_reached():
    queue = EventQueue()
    shares: list[float] = []
    for t in (10.0, 50.0, 50.5, 99.0):
        queue.at(t, lambda: None)
    queue.run(100.0, shares.append)
    assert shares == [0.1, 0.5, 0.99]


def test_events_scheduled_at_each_run_as_if_scheduled_one_by_one():
    # Ties between them, with events scheduled before and during the run, and an item due
    # in the past: the same order either way.
    items = [(2.0, "a"), (1.0, "b"), (2.0, "c"), (-1.0, "past"), (1.0, "d"), (3.0, "e")]

    def run(one_by_one: bool) -> list[tuple[float, str]]:
        queue, ran, note = _recording()

        def arrive(item: tuple[float, str]) -> None:
            note(item[1])
            queue.at(queue.now, note, f"after {item[1]}")

        queue.at(1.0, note, "scheduled before")
        if one_by_one:
            for item in items:
                queue.at(item[0], arrive, item)
        else:
            queue.at_each(arrive, items, lambda item: item[0])
        queue.at(2.0, note, "scheduled after")
        queue.run(10.0)
        return ran

    assert run(one_by_one=False) == run(one_by_one=True)
    assert run(one_by_one=False)[:3] == [
        (0.0, "past"),
        (0.0, "after past"),
        (1.0, "scheduled before"),
    ]
