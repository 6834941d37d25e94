"""Argument types for the ``queue`` command: each refuses bad input with a clear message."""

import argparse
import json
import math
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from stalwart.exceptions import InvalidQueueName
from stalwart.queues import QueueSelector, validate_queue_name


def queue_list(value: str) -> QueueSelector:
    try:
        return QueueSelector.parse(value)
    except InvalidQueueName as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def whole(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"{value!r} must be at least {minimum}")
        if number > maximum:
            raise argparse.ArgumentTypeError(f"{value!r} must be at most {maximum}")
        return number

    return parse


def seconds_between(minimum: float, maximum: float) -> Callable[[str], float]:
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
        if not minimum <= number <= maximum:
            raise argparse.ArgumentTypeError(
                f"{value!r} must be between {minimum:g} and {maximum:g} seconds"
            )
        return number

    return parse


positive_int = whole(1, 1000)
non_negative_int = whole(0, 1000)
poll_seconds = seconds_between(0.01, 3600)
seconds = seconds_between(0, 86400)


def queue_name(value: str) -> str:

    try:
        return validate_queue_name(value)
    except InvalidQueueName as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def job_id(value: str) -> str:

    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a job id") from None


_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


MAX_DURATION = timedelta(days=36500)


def parse_duration(value: str) -> Any:
    """'90s', '15m', '12h', '7d', '2w' or plain seconds, as a timedelta (up to 100 years)."""
    text = value.strip().lower()
    unit = text[-1:] if text[-1:] in _DURATION else "s"
    number = text[:-1] if text[-1:] in _DURATION else text
    try:
        amount = float(number)
    except ValueError:
        amount = math.nan
    if not math.isfinite(amount):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a duration (examples: 90s, 15m, 12h, 7d, 2w)"
        )
    if amount < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must not be negative")
    seconds = amount * _DURATION[unit]
    if seconds > MAX_DURATION.total_seconds():
        raise argparse.ArgumentTypeError(f"{value!r} is longer than 100 years")
    return timedelta(seconds=seconds)


def json_value(kind: type) -> Callable[[str], Any]:
    def parse(value: str) -> Any:

        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as error:
            raise argparse.ArgumentTypeError(f"{value!r} is not JSON: {error}") from None
        if not isinstance(parsed, kind):
            raise argparse.ArgumentTypeError(
                f"{value!r} must be a JSON {'array' if kind is list else 'object'}"
            )
        return parsed

    return parse
