"""Events: emitted where things happen, turned into log lines in one place (``stalwart.log``).

``emit("job_succeeded", job=..., duration=...)`` calls every subscriber with the action name
and the fields. Subscribe your own callable (metrics, tracing) with ``subscribe``.
"""

import logging
from collections.abc import Callable
from typing import Any

Subscriber = Callable[[str, dict[str, Any]], None]

_subscribers: list[Subscriber] = []


def subscribe(subscriber: Subscriber) -> None:
    """Call ``subscriber(action, fields)`` for every event from now on."""
    if subscriber not in _subscribers:
        _subscribers.append(subscriber)


def unsubscribe(subscriber: Subscriber) -> None:
    if subscriber in _subscribers:
        _subscribers.remove(subscriber)


def emit(action: str, /, **fields: Any) -> None:
    """Report that ``action`` happened. A subscriber that raises is logged, never propagated:
    reporting must not change what it reports on."""
    for subscriber in _subscribers:
        try:
            subscriber(action, fields)
        except Exception:
            logging.getLogger("stalwart").exception(
                "action=event_subscriber_failed subscriber=%r event=%s",
                subscriber,
                action,
                extra={
                    "action": "event_subscriber_failed",
                    "stalwart": {"subscriber": repr(subscriber), "event": action},
                },
            )
