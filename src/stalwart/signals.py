"""Sending Django's task signals to the application's receivers, robustly.

Receivers are the application's code, run on the queue's behalf: one that raises must not
kill a worker, strand a job or undo an enqueue. Each signal goes out with ``send_robust``:
every receiver runs, and one that raises becomes a ``signal_receiver_failed`` event (logged
with its traceback).
"""

from traceback import format_exception
from typing import Any

from django.dispatch import Signal

from stalwart import events


def _describe(receiver: Any) -> str:
    name = getattr(receiver, "__qualname__", None) or type(receiver).__qualname__
    module = getattr(receiver, "__module__", None)
    return f"{module}.{name}" if module else name


def send(signal: Signal, name: str, *, sender: Any, **named: Any) -> None:
    """Send ``signal`` (called ``name`` in events); a receiver that raises is reported."""
    for receiver, response in signal.send_robust(sender=sender, **named):
        if isinstance(response, Exception):
            events.emit(
                "signal_receiver_failed",
                signal=name,
                receiver=_describe(receiver),
                error=f"{type(response).__name__}: {response}",
                traceback="".join(format_exception(response)),
            )
