"""The cycle collector pause around a bulk store: nested and concurrent pauses, and the state it restores."""

from __future__ import annotations

import gc
import threading

from validator.service.cycle_collector import cycle_collector_paused


def test_the_collector_runs_again_when_the_last_pause_ends() -> None:
    assert gc.isenabled()
    entered, leave = threading.Event(), threading.Event()

    def other() -> None:
        with cycle_collector_paused():
            entered.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    with cycle_collector_paused():
        assert not gc.isenabled()
        t.start()
        assert entered.wait(10)
    assert not gc.isenabled()  # the other thread still stores its run
    leave.set()
    t.join(10)
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled() -> None:
    gc.disable()
    try:
        with cycle_collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
