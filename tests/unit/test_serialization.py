import enum
import json
import math

import pytest

from stalwart.exceptions import ArgumentsTooLarge, InvalidTaskArguments
from stalwart.serialization import encode_arguments, normalize, normalize_arguments


class Color(enum.StrEnum):
    RED = "red"


class Size(enum.IntEnum):
    LARGE = 3


def round_trip(value):
    return json.loads(json.dumps(value))


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -(2**70),
        1.5,
        -0.0,
        "text with ünïcødé and emoji 🎉",
        [],
        {},
        {"nested": [1, {"deeper": [None, "x"]}]},
    ],
)
def test_values_that_survive_json_come_back_equal(value):
    assert normalize(value, "args") == value
    assert round_trip(normalize(value, "args")) == value


def test_tuples_become_lists_as_json_would_return_them():
    args, kwargs = normalize_arguments((1, (2, 3)), {"pair": ("a", "b")})
    assert args == [1, [2, 3]]
    assert kwargs == {"pair": ["a", "b"]}
    assert round_trip(args) == args


def test_enum_members_are_stored_as_their_plain_values():
    value = normalize([Color.RED, Size.LARGE], "args")
    assert value == ["red", 3]
    assert type(value[0]) is str
    assert type(value[1]) is int


def test_utf8_bytes_become_text_like_django_normalize_json():
    assert normalize(b"caf\xc3\xa9", "args") == "café"


@pytest.mark.parametrize("value", [bytearray(b"ab"), memoryview(b"ab")])
def test_binary_buffers_are_refused_rather_than_stored_as_lists_of_numbers(value):
    with pytest.raises(InvalidTaskArguments) as caught:
        normalize_arguments([value], {})
    kind = type(value).__name__
    assert str(caught.value) == (
        f"args[0] is a {kind}, which would be stored as a list of numbers: pass bytes(...) "
        "(valid UTF-8, stored as text), or the list itself if that is meant"
    )


@pytest.mark.parametrize(
    ("kwargs", "path", "problem"),
    [
        ({"when": object()}, "kwargs['when']", "of type object"),
        ({"ratio": math.nan}, "kwargs['ratio']", "nan"),
        ({"limit": math.inf}, "kwargs['limit']", "inf"),
        ({"by_id": {1: "a"}}, "kwargs['by_id']", "has the key 1 of type int"),
        ({"text": "a\x00b"}, "kwargs['text']", "NUL character"),
        ({"text": "\ud800"}, "kwargs['text']", "lone surrogate"),
        ({"deep": [[{"x": {1, 2}}]]}, "kwargs['deep'][0][0]['x']", "of type set"),
        ({"raw": b"\xff"}, "kwargs['raw']", "not valid UTF-8"),
        ({"k\x00ey": 1}, "kwargs['k\\x00ey']", "NUL character"),
    ],
)
def test_values_that_would_not_survive_are_rejected_with_their_path(kwargs, path, problem):
    with pytest.raises(InvalidTaskArguments) as caught:
        normalize_arguments((), kwargs)
    assert caught.value.path == path
    assert problem in caught.value.problem
    assert path in str(caught.value)


def test_positional_arguments_are_named_by_index():
    with pytest.raises(InvalidTaskArguments, match=r"for args\[1\]\[0\]: complex"):
        normalize_arguments((1, [1j]), {})


def test_nesting_deeper_than_the_limit_is_rejected_not_a_recursion_error():
    value: list = []
    for _ in range(200):
        value = [value]
    with pytest.raises(InvalidTaskArguments, match="nested more than 100 levels"):
        normalize(value, "args")


def test_size_limit_counts_encoded_utf8_bytes():
    args, kwargs = normalize_arguments(("é" * 600,), {})
    with pytest.raises(ArgumentsTooLarge) as caught:
        encode_arguments(args, kwargs, limit=1000)
    assert caught.value.size > 1200
    assert "limit of 1000 bytes" in str(caught.value)
    encoded_args, encoded_kwargs = encode_arguments(args, kwargs, limit=2000)
    assert json.loads(encoded_args) == args
    assert json.loads(encoded_kwargs) == {}


@pytest.mark.parametrize(
    ("args", "kwargs", "stored"),
    [
        ((), {}, ("[]", "{}")),
        ([], {"a": []}, ("[]", '{"a":[]}')),
        ((1, ()), {"b": {}}, ("[1,[]]", '{"b":{}}')),
        (("é", 1.5, None), {"x": [True, {"y": "z"}]}, ('["é",1.5,null]', '{"x":[true,{"y":"z"}]}')),
    ],
)
def test_arguments_encode_as_compact_json_empty_ones_included(args, kwargs, stored):
    assert encode_arguments(*normalize_arguments(args, kwargs), limit=1000) == stored
