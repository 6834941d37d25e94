"""Job ids: UUID version 7, so ids sort by creation time and index inserts stay local.

Within one process the ids are strictly increasing, even for ids made in the same
millisecond: the random part then continues from the previous id by a random step
(RFC 9562, section 6.2, method 2), so two jobs enqueued back to back keep their order.
"""

import os
import threading
import time
import uuid

_VERSION = 0x7 << 76
_VARIANT = 0x2 << 62
_RANDOM_A_BITS = 12
_RANDOM_B_BITS = 62
_RANDOM_BITS = _RANDOM_A_BITS + _RANDOM_B_BITS
_MS_MASK = (1 << 48) - 1
_STEP_BITS = 32


def _random(bits: int) -> int:
    return int.from_bytes(os.urandom((bits + 7) // 8)) >> (-bits % 8)


class _Sequence:
    """The previous id's millisecond and random part, so the next id can follow it."""

    def __init__(self):
        self.forget()

    def forget(self) -> None:
        # A new lock too: a fork taken while another thread held the old one would leave it
        # held for ever in the child.
        self._lock = threading.Lock()
        self._last = (0, 0)

    def next(self) -> tuple[int, int]:
        with self._lock:
            milliseconds = time.time_ns() // 1_000_000
            last_milliseconds, last_random = self._last
            if milliseconds > last_milliseconds:
                random = _random(_RANDOM_BITS)
            else:
                milliseconds = last_milliseconds
                random = last_random + 1 + _random(_STEP_BITS)
                if random >> _RANDOM_BITS:  # the random part ran out: borrow the next ms
                    milliseconds += 1
                    random = _random(_RANDOM_BITS)
            self._last = (milliseconds, random)
            return milliseconds, random


_sequence = _Sequence()
# A forked child starts its own sequence rather than repeat its parent's next ids.
os.register_at_fork(after_in_child=_sequence.forget)


def uuid7() -> uuid.UUID:
    """A new time-ordered UUID (RFC 9562, version 7), increasing within this process."""
    milliseconds, random = _sequence.next()
    random_a = random >> _RANDOM_B_BITS
    random_b = random & ((1 << _RANDOM_B_BITS) - 1)
    value = ((milliseconds & _MS_MASK) << 80) | _VERSION | (random_a << 64) | _VARIANT | random_b
    return uuid.UUID(int=value)
