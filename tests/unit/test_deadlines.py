"""The liveness arithmetic: every bound it offers as safe holds, and nothing safe is refused."""

import itertools

import pytest

from stalwart import deadlines
from stalwart.deadlines import Deadlines

INTERVALS = [0.05, 0.1, 0.25, 0.5, 0.8, 1.0, 2.0, 5.0, 10.0, 30.0]
THRESHOLDS = [0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 20.0, 30.0, 60.0, 120.0]
TIMEOUTS = [0.01, 0.1, 0.25, 0.5, 1.0, 1.5, 2.5, 10.0]


@pytest.mark.parametrize(("interval", "threshold", "timeout"), [(10, 60, 10), (0.5, 4, 1)])
def test_the_defaults_and_the_fault_suites_settings_hold(interval, threshold, timeout):
    found = Deadlines(interval=interval, threshold=threshold, statement_timeout=timeout)
    assert found.holds
    # A healthy process is suspended before it is killed, and killed before it is pruned.
    assert found.suspend < found.kill < found.threshold


def test_a_healthy_beat_pattern_never_reaches_the_kill_deadline():
    for interval, threshold, timeout in itertools.product(INTERVALS, THRESHOLDS, TIMEOUTS):
        found = Deadlines(interval=interval, threshold=threshold, statement_timeout=timeout)
        if not found.holds:
            continue
        # The worst a healthy process sees: the beat after its last success fails (taking
        # up to the statement timeout), the next one goes through as slowly as it may.
        pace = max(interval, timeout)
        assert 2 * pace + timeout <= found.kill + 1e-9


def test_the_longest_safe_statement_timeout_holds_and_a_little_more_does_not():
    for interval, threshold in itertools.product(INTERVALS, THRESHOLDS):
        longest = deadlines.longest_statement_timeout(interval, threshold)
        if longest < deadlines.SMALLEST_STATEMENT_TIMEOUT:
            continue
        assert deadlines.problem(interval, threshold, longest) is None
        assert deadlines.problem(interval, threshold, longest * 1.01 + 0.001) is not None


def test_the_longest_safe_interval_holds_and_a_little_more_does_not():
    for threshold, timeout in itertools.product(THRESHOLDS, TIMEOUTS):
        longest = deadlines.longest_interval(threshold, timeout)
        if longest < 0.05:
            continue
        assert deadlines.problem(longest, threshold, timeout) is None
        if longest > timeout:  # (below the timeout, the interval no longer sets the pace)
            assert deadlines.problem(longest * 1.01 + 0.001, threshold, timeout) is not None


def test_every_value_a_refusal_offers_as_safe_is():
    for interval, threshold, timeout in itertools.product(INTERVALS, THRESHOLDS, TIMEOUTS):
        text = deadlines.problem(interval, threshold, timeout)
        if text is None:
            continue
        safe = text.split("Safe values: ")[1]
        needed = float(safe.split("process_alive_threshold ")[1].split(" s")[0])
        assert deadlines.problem(interval, needed, timeout) is None
        if "statement_timeout " in safe:
            shorter = float(safe.split("statement_timeout ")[1].split(" s")[0])
            assert deadlines.problem(interval, threshold, shorter) is None
        if "heartbeat_interval " in safe:
            faster = float(safe.split("heartbeat_interval ")[1].split(" s")[0])
            assert deadlines.problem(faster, threshold, timeout) is None


def test_the_threshold_offered_with_the_default_statement_timeout_holds_with_it():
    for interval, threshold in itertools.product(INTERVALS, THRESHOLDS):
        timeout = deadlines.default_statement_timeout(threshold)
        text = deadlines.problem(interval, threshold, timeout, by_default=True)
        if text is None:
            continue
        needed = float(text.split("process_alive_threshold ")[1].split(" s")[0])
        # With the default timeout that threshold brings, it holds.
        assert (
            deadlines.problem(
                interval, needed, deadlines.default_statement_timeout(needed), by_default=True
            )
            is None
        )
