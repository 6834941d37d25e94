"""Loaded (as ``sitecustomize``) only by processes the fault suite runs under ``faketime``.

libfaketime 0.9.10 mistranslates ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, …)``,
which ``time.sleep`` uses since Python 3.11: every sleep fails with ``EINVAL``. Sleeping on
``select()`` with a relative timeout instead keeps ``time.sleep`` working (and the monotonic
clock is not faked), so the skewed process differs from the others by its wall clock only.
"""

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep
