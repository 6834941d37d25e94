"""The JSON round trip that arguments and return values go through.

Arguments are accepted only if what comes back from the database equals what went in, on
every supported database: so tuples become lists (as Django's own ``normalize_json`` does),
and NaN, infinities, non-string keys, NUL characters (PostgreSQL cannot store them) and lone
surrogates (not encodable as UTF-8) are refused at enqueue with the path of the offending
value (``InvalidTaskArguments``, a ``TypeError``). So are ``bytearray`` and ``memoryview``:
JSON would store them as lists of numbers.

A return value is stored the way ``json.dumps`` would write it: a key that is an int, a
float, a bool or None becomes its JSON text (``{1: "a"}`` is stored, and read back, as
``{"1": "a"}``), since the task has run and refusing the value would turn its success into a
failure. A value JSON cannot hold at all fails the attempt with the exception class Django's
own backends use: ``TypeError`` for a type, ``ValueError`` for a value (NaN, NUL, ...).
"""

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from stalwart.exceptions import ArgumentsTooLarge, InvalidTaskArguments

MAX_DEPTH = 100

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class _Rejected(Exception):
    def __init__(self, problem: str, *, type_name: str | None = None) -> None:
        self.problem = problem
        self.type_name = type_name  # set when the value's type is what JSON cannot hold
        self.parts: list[str] = []

    def message(self, path: str) -> str:
        if self.type_name is not None:
            # Django's own backends say "Unsupported type"; so do we, with the path.
            return f"Unsupported type for {path}: {self.type_name}, which is not JSON serializable."
        return f"{path} {self.problem}"


def _json_key(key: object) -> str:
    """A mapping key as ``json.dumps`` writes it (which refuses other keys)."""
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int):
        return int.__repr__(key)
    if isinstance(key, float):
        if not math.isfinite(key):
            raise _Rejected(f"has the key {key!r}, which JSON cannot represent")
        return float.__repr__(key)
    raise _Rejected(
        f"has the key {key!r} of type {type(key).__name__}; JSON object keys are strings "
        "(or ints, floats, bools and None, written as strings)",
        type_name=f"{type(key).__qualname__} (a key)",
    )


def _check_text(text: str) -> None:
    if "\x00" in text:
        raise _Rejected("contains a NUL character (\\x00), which PostgreSQL cannot store")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _Rejected("contains a lone surrogate, which is not valid UTF-8") from None


def _normalize(  # noqa: PLR0911, PLR0912 - a branch per type
    value: Any, depth: int, json_keys: bool
) -> Any:
    """``json_keys``: write keys as ``json.dumps`` does (return values), rather than refuse
    keys that are not strings (arguments, which must come back as they went in)."""
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
    # Plain containers by exact type too: asking the abstract classes costs more than the
    # rest of a small call's arguments.
    if kind is list or kind is tuple:
        return _normalize_items(value, depth, json_keys)
    if kind is dict or isinstance(value, Mapping):
        result = {}
        for key, item in value.items():
            # A key that is not a string is the mapping's problem (its path is the mapping's).
            if isinstance(key, str):
                name = str.__str__(key)
            elif json_keys:
                name = _json_key(key)
            else:
                raise _Rejected(
                    f"has the key {key!r} of type {type(key).__name__}; JSON object keys "
                    "are strings, so it would come back changed"
                )
            try:
                _check_text(name)
                result[name] = _normalize(item, depth + 1, json_keys)
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
        return _normalize(str.__str__(value), depth, json_keys)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return _normalize(float.__float__(value), depth, json_keys)
    if isinstance(value, bytearray | memoryview) and not json_keys:
        # Sequences of numbers to JSON: an argument b"ab" would come back as [97, 98].
        raise _Rejected(
            f"is a {kind.__qualname__}, which would be stored as a list of numbers: pass "
            "bytes(...) (valid UTF-8, stored as text), or the list itself if that is meant"
        )
    if isinstance(value, Sequence):
        return _normalize_items(value, depth, json_keys)
    raise _Rejected(
        f"is of type {kind.__qualname__}, which JSON cannot represent", type_name=kind.__qualname__
    )


def _normalize_items(value: Sequence, depth: int, json_keys: bool) -> list:
    result = []
    for index, item in enumerate(value):
        try:
            result.append(_normalize(item, depth + 1, json_keys))
        except _Rejected as rejected:
            rejected.parts.append(f"[{index}]")
            raise
    return result


def normalize(value: Any, path: str) -> Any:
    """Return ``value`` as it will come back from the database, or raise
    ``InvalidTaskArguments`` (a ``TypeError``) with its path."""
    try:
        return _normalize(value, 0, json_keys=False)
    except _Rejected as rejected:
        where = path + "".join(reversed(rejected.parts))
        raise InvalidTaskArguments(where, rejected.problem, rejected.message(where)) from None


def normalize_return_value(value: Any, path: str = "return value") -> Any:
    """Return a task's return value as it will be stored (keys written as JSON writes them),
    or raise ``TypeError`` (a type JSON cannot hold) or ``ValueError`` (a value it cannot
    hold), as Django's own backends do, with the value's path."""
    try:
        return _normalize(value, 0, json_keys=True)
    except _Rejected as rejected:
        where = path + "".join(reversed(rejected.parts))
        kind = TypeError if rejected.type_name is not None else ValueError
        raise kind(rejected.message(where)) from None


def normalize_arguments(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list, dict]:
    """Normalize a call's positional and keyword arguments, naming the bad one if any."""
    return normalize(list(args), "args"), normalize(dict(kwargs), "kwargs")


# What an empty list or dict encodes to: no arguments, or no keyword arguments, the most
# common call of all, without a trip through the encoder.
_EMPTY: dict[type, str] = {list: "[]", dict: "{}"}


def dumps(value: Any) -> str:
    """Encode an already normalized value compactly."""
    if not value and type(value) in _EMPTY:
        return _EMPTY[type(value)]
    return _encoder.encode(value)


def encode_arguments(args: list, kwargs: dict, limit: int) -> tuple[str, str]:
    """Encode normalized arguments, enforcing the size limit on what is stored."""
    encoded_args, encoded_kwargs = dumps(args), dumps(kwargs)
    size = len(encoded_args.encode()) + len(encoded_kwargs.encode())
    if size > limit:
        raise ArgumentsTooLarge(size, limit)
    return encoded_args, encoded_kwargs
