"""Job ids: UUID version 7, so ids sort by creation time and index inserts stay local."""

import os
import time
import uuid

_VERSION = 0x7 << 76
_VARIANT = 0x2 << 62
_RANDOM_BITS = (1 << 76) - 1
_MS_MASK = (1 << 48) - 1


def uuid7() -> uuid.UUID:
    """A new time-ordered UUID (RFC 9562, version 7)."""
    milliseconds = time.time_ns() // 1_000_000
    random = int.from_bytes(os.urandom(10)) & _RANDOM_BITS
    value = ((milliseconds & _MS_MASK) << 80) | random
    value = (value & ~(0xF << 76)) | _VERSION
    value = (value & ~(0x3 << 62)) | _VARIANT
    return uuid.UUID(int=value)
