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


# Bytes of randomness each id draws: enough for a fresh random part (74 bits), whose first
# four also make the step (32 bits) from the previous id in the same millisecond.
_ENTROPY_BYTES = 10


def _follow(milliseconds: int, last: tuple[int, int], entropy: bytes) -> tuple[int, int]:
    """The millisecond and random part of the id after ``last``, made at ``milliseconds``."""
    last_milliseconds, last_random = last
    if milliseconds > last_milliseconds:
        return milliseconds, int.from_bytes(entropy) >> (_ENTROPY_BYTES * 8 - _RANDOM_BITS)
    random = last_random + 1 + int.from_bytes(entropy[: _STEP_BITS // 8])
    if random >> _RANDOM_BITS:  # the random part ran out: borrow the next ms
        return last_milliseconds + 1, int.from_bytes(entropy) >> (_ENTROPY_BYTES * 8 - _RANDOM_BITS)
    return last_milliseconds, random


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
            self._last = _follow(
                time.time_ns() // 1_000_000, self._last, os.urandom(_ENTROPY_BYTES)
            )
            return self._last

    def next_many(self, count: int) -> list[tuple[int, int]]:
        """``count`` ids in a row: one lock, one look at the clock, one read of randomness
        (a bulk enqueue makes thousands)."""
        entropy = os.urandom(count * _ENTROPY_BYTES)
        made = []
        with self._lock:
            milliseconds, last = time.time_ns() // 1_000_000, self._last
            for start in range(0, count * _ENTROPY_BYTES, _ENTROPY_BYTES):
                last = _follow(milliseconds, last, entropy[start : start + _ENTROPY_BYTES])
                made.append(last)
            self._last = last
        return made


_sequence = _Sequence()
# A forked child starts its own sequence rather than repeat its parent's next ids.
os.register_at_fork(after_in_child=_sequence.forget)


def uuid7() -> uuid.UUID:
    """A new time-ordered UUID (RFC 9562, version 7), increasing within this process."""
    return _as_uuid(*_sequence.next())


def uuid7s(count: int) -> list[uuid.UUID]:
    """``count`` new ids, as ``uuid7()`` would make them one after another."""
    return [_as_uuid(milliseconds, random) for milliseconds, random in _sequence.next_many(count)]


def _as_uuid(milliseconds: int, random: int) -> uuid.UUID:
    random_a = random >> _RANDOM_B_BITS
    random_b = random & ((1 << _RANDOM_B_BITS) - 1)
    value = ((milliseconds & _MS_MASK) << 80) | _VERSION | (random_a << 64) | _VARIANT | random_b
    return uuid.UUID(int=value)
