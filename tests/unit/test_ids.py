import uuid

from stalwart.ids import uuid7


def test_uuid7_has_version_and_variant():
    value = uuid7()
    assert value.version == 7
    assert value.variant == uuid.RFC_4122


def test_uuid7_sorts_by_creation_millisecond():
    values = [uuid7() for _ in range(2000)]
    milliseconds = [value.int >> 80 for value in values]
    assert milliseconds == sorted(milliseconds)
    assert len(set(values)) == len(values)


def test_uuid7_made_back_to_back_keep_their_order():
    values = [uuid7() for _ in range(5000)]
    assert values == sorted(values)
    assert len(set(values)) == len(values)
    assert {value.version for value in values} == {7}
    assert {value.variant for value in values} == {uuid.RFC_4122}
