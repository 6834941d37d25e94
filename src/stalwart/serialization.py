"""The JSON round trip that arguments and return values go through.

A value is accepted only if what comes back from the database equals what went in, on every
supported database: so tuples become lists (as Django's own ``normalize_json`` does), and
NaN, infinities, non-string keys, NUL characters (PostgreSQL cannot store them) and lone
surrogates (not encodable as UTF-8) are rejected with the path of the offending value.
"""

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from stalwart.exceptions import ArgumentsTooLarge, InvalidTaskArguments

MAX_DEPTH = 100

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class _Rejected(Exception):
    def __init__(self, problem: str) -> None:
        self.problem = problem
        self.parts: list[str] = []


def _check_text(text: str) -> None:
    if "\x00" in text:
        raise _Rejected("contains a NUL character (\\x00), which PostgreSQL cannot store")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _Rejected("contains a lone surrogate, which is not valid UTF-8") from None


def _normalize(value: Any, depth: int) -> Any:  # noqa: PLR0911, PLR0912 - a branch per type
    # The common scalar types first, by exact type: this runs for every argument enqueued.
    kind = type(value)
    if kind is str:
        _check_text(value)
        return value
    if kind is int or kind is bool or value is None:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise _Rejected(f"is {value!r}, which JSON cannot represent")
        return value
    if depth >= MAX_DEPTH:
        raise _Rejected(f"is nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, Mapping):
        result = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Rejected(
                    f"has the key {key!r} of type {type(key).__name__}; JSON object keys are "
                    "strings, so it would come back changed"
                )
            try:
                _check_text(key)
                result[key] = _normalize(item, depth + 1)
            except _Rejected as rejected:
                rejected.parts.append(f"[{key!r}]")
                raise
        return result
    if isinstance(value, bytes):
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            raise _Rejected("is bytes that are not valid UTF-8") from None
        _check_text(text)
        return text
    # Subclasses (enums, for example) are stored as their plain value.
    if isinstance(value, str):
        return _normalize(str.__str__(value), depth)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return _normalize(float.__float__(value), depth)
    if isinstance(value, Sequence):
        result_list = []
        for index, item in enumerate(value):
            try:
                result_list.append(_normalize(item, depth + 1))
            except _Rejected as rejected:
                rejected.parts.append(f"[{index}]")
                raise
        return result_list
    raise _Rejected(f"is of type {kind.__qualname__}, which JSON cannot represent")


def normalize(value: Any, path: str) -> Any:
    """Return ``value`` as it will come back from the database, or raise with its path."""
    try:
        return _normalize(value, 0)
    except _Rejected as rejected:
        raise InvalidTaskArguments(
            path + "".join(reversed(rejected.parts)), rejected.problem
        ) from None


def normalize_arguments(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list, dict]:
    """Normalize a call's positional and keyword arguments, naming the bad one if any."""
    return normalize(list(args), "args"), normalize(dict(kwargs), "kwargs")


def dumps(value: Any) -> str:
    """Encode an already normalized value compactly."""
    return _encoder.encode(value)


def encode_arguments(args: list, kwargs: dict, limit: int) -> tuple[str, str]:
    """Encode normalized arguments, enforcing the size limit on what is stored."""
    encoded_args, encoded_kwargs = dumps(args), dumps(kwargs)
    size = len(encoded_args.encode()) + len(encoded_kwargs.encode())
    if size > limit:
        raise ArgumentsTooLarge(size, limit)
    return encoded_args, encoded_kwargs
