"""When a process is suspended, ended by the kernel, and pruned: the liveness arithmetic, in
one place (settings are checked against it; the heartbeat keeps to it).

A process sends a heartbeat every ``interval`` seconds, at a fixed rate (a slow beat does not
push the next one back). The database stamps each beat with its own clock; pruners take a
process for dead ``threshold`` seconds after its last stamp. A beat is dated by its sending
time (the stamp is never earlier), so counting from the sending of the last beat that worked:

- ``suspend``: a beat is overdue (the pace of beats, plus the longest a statement may run).
  The process stops claiming new jobs, goes on running and writing the ones it has, and
  claims again as soon as a beat goes through: a slow database only slows it down.
- ``kill``: the kernel ends the process (a timer re-armed by each beat that works), whatever
  its threads are doing, so that no job of its can ever run here and elsewhere at once. It
  comes ``margin`` before anyone may prune the process.
- ``threshold``: the process may be pruned, and its jobs given to others.

Beats are paced by the interval, or by the beats themselves where a statement takes longer
than that (``pace``: the longer of ``interval`` and ``statement_timeout``). A healthy process
must never reach ``kill``, even on a slow database: one beat may fail outright, and the next
may take as long as a statement may. So ``threshold`` must be at least ``2 x pace +
statement_timeout + margin``: settings that cannot hold are refused (``stalwart.conf``),
with the values that would. (A reconnection is bounded by the connection's
``connect_timeout``, the statement timeout's, and counts as that failed beat.)

A process's main loop is taken for stalled (its heartbeats stop vouching for it) after
``stall`` seconds busy without progress: half the threshold, which is longer than any
statement of the loop may take (a quarter of it at most) plus a reconnection.
"""

import math
from dataclasses import dataclass

DEFAULT_STATEMENT_TIMEOUT = 10.0
SMALLEST_STATEMENT_TIMEOUT = 0.01


def margin_for(interval: float) -> float:
    """Seconds between the kernel's deadline and the earliest prune: time for the process to
    be gone, and for the two clocks (the host's monotonic one, the database's) to drift."""
    return max(0.5, interval / 2)


def pace(interval: float, statement_timeout: float) -> float:
    """The longest time between two beats being sent on a healthy database: the interval,
    or, where beats are slower than that, a beat (at a fixed rate, the next one goes out as
    soon as the last is answered)."""
    return max(interval, statement_timeout)


def minimum_threshold(interval: float, statement_timeout: float) -> float:
    """The shortest ``process_alive_threshold`` that holds for these settings: a beat that
    fails, then one that goes through however slowly, then the margin."""
    return 2 * pace(interval, statement_timeout) + statement_timeout + margin_for(interval)


def _holds(interval: float, threshold: float, statement_timeout: float) -> bool:
    return threshold >= minimum_threshold(interval, statement_timeout) - 1e-9


def longest_statement_timeout(interval: float, threshold: float) -> float:
    """The longest ``statement_timeout`` that holds with these settings (negative: none)."""
    margin = margin_for(interval)
    # Up to the interval, beats keep the interval's pace; beyond it, their own.
    within = min(interval, threshold - 2 * interval - margin)
    beyond = (threshold - margin) / 3
    return beyond if beyond > interval else within


def longest_interval(threshold: float, statement_timeout: float) -> float:
    """The longest ``heartbeat_interval`` that holds with these settings (0: none)."""
    room = threshold - statement_timeout
    # margin_for() is 0.5 below an interval of 1 s, and half the interval from there.
    longest = (room - 0.5) / 2 if room < 2.5 else room / 2.5
    if longest >= statement_timeout:
        return longest
    # Shorter than the statement timeout, the interval no longer sets the pace; it still
    # sets the margin, from 1 s up.
    if 3 * statement_timeout + 0.5 > threshold:
        return 0.0
    return min(statement_timeout, max(1.0, 2 * (threshold - 3 * statement_timeout)))


def default_statement_timeout(threshold: float) -> float:
    """``statement_timeout`` when the settings leave it out: 10 s, or a quarter of the
    threshold if that is less (a statement that hangs is cancelled well before its process
    would be taken for stalled). Not shortened to fit: settings that do not hold with it are
    refused, with the values that would."""
    return min(DEFAULT_STATEMENT_TIMEOUT, threshold / 4)


@dataclass(frozen=True, slots=True)
class Deadlines:
    """The deadlines of a process with these settings (see the module's docstring)."""

    interval: float
    threshold: float
    statement_timeout: float

    @property
    def margin(self) -> float:
        return margin_for(self.interval)

    @property
    def suspend(self) -> float:
        return pace(self.interval, self.statement_timeout) + self.statement_timeout

    @property
    def kill(self) -> float:
        return self.threshold - self.margin

    @property
    def stall(self) -> float:
        return self.threshold / 2

    @property
    def holds(self) -> bool:
        return _holds(self.interval, self.threshold, self.statement_timeout)


def _down(seconds: float) -> float:
    """Rounded down to the millisecond: a bound offered as safe must be."""
    return math.floor(seconds * 1000) / 1000


def _up(seconds: float) -> float:
    return math.ceil(seconds * 1000 - 1e-6) / 1000


def minimum_threshold_by_default(interval: float) -> float:
    """The shortest ``process_alive_threshold`` that holds with this interval when the
    statement timeout is left to its default (which grows with the threshold)."""
    threshold = minimum_threshold(interval, SMALLEST_STATEMENT_TIMEOUT)
    for _ in range(200):  # a contraction: each step adds at most 3/4 of the last one
        needed = minimum_threshold(interval, default_statement_timeout(threshold))
        if needed <= threshold + 1e-9:
            break
        threshold = needed
    return threshold


def problem(
    interval: float, threshold: float, statement_timeout: float, *, by_default: bool = False
) -> str | None:
    """Why these settings cannot hold, with the values that would; None if they hold.
    ``by_default``: the statement timeout is the default's, which a longer threshold raises."""
    if _holds(interval, threshold, statement_timeout):
        return None
    if by_default:
        needed = minimum_threshold_by_default(interval)
    else:
        needed = minimum_threshold(interval, statement_timeout)
    longest = _down(longest_statement_timeout(interval, threshold))
    options = [f"process_alive_threshold {_up(needed):g} s or more"]
    if longest >= SMALLEST_STATEMENT_TIMEOUT:
        options.append(f"statement_timeout {longest:g} s or less")
    shorter = _down(longest_interval(threshold, statement_timeout))
    if shorter >= 0.05:
        options.append(f"heartbeat_interval {shorter:g} s or less")
    return (
        f"is too short for heartbeat_interval {interval:g} s and statement_timeout "
        f"{statement_timeout:g} s: a healthy process must survive a failed heartbeat and a slow "
        f"one before the kernel ends it, {margin_for(interval):g} s before it may be pruned "
        f"(2 x the longer of heartbeat_interval and statement_timeout, + statement_timeout "
        f"+ {margin_for(interval):g} s). Safe values: {'; or '.join(options)}"
    )
