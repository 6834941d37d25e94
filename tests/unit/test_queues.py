import pytest

from stalwart.exceptions import InvalidQueueName
from stalwart.queues import QueuePattern, QueueSelector, validate_queue_name


@pytest.mark.parametrize("name", ["default", "emails.high", "a-b_c", "Q1", "x" * 64])
def test_valid_queue_names(name):
    assert validate_queue_name(name) == name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "non-empty"),
        ("has space", "only ASCII letters"),
        ("semi;colon", "only ASCII letters"),
        ("ünï", "only ASCII letters"),
        ("x" * 65, "65 characters long; the limit is 64"),
        (None, "non-empty string"),
    ],
)
def test_invalid_queue_names_are_refused_with_the_reason(name, message):
    with pytest.raises(InvalidQueueName, match=message):
        validate_queue_name(name)


def test_selector_keeps_order_and_drops_duplicates():
    selector = QueueSelector.parse("high, default,high,reports*")
    assert [str(pattern) for pattern in selector.patterns] == ["high", "default", "reports*"]


def test_selector_star_serves_everything_but_exclusions():
    selector = QueueSelector.parse("*,!low,!tmp*")
    assert selector.serves("default")
    assert selector.serves("reports.daily")
    assert not selector.serves("low")
    assert not selector.serves("tmp-1")
    assert str(selector) == "*,!low,!tmp*"


def test_selector_with_only_exclusions_means_every_other_queue():
    selector = QueueSelector.parse(["!low"])
    assert selector.patterns == (QueuePattern("", is_prefix=True),)
    assert selector.serves("default")
    assert not selector.serves("low")


def test_prefix_pattern_matches_by_prefix_only():
    selector = QueueSelector.parse("mail*")
    assert selector.serves("mail")
    assert selector.serves("mail.bulk")
    assert not selector.serves("email")


@pytest.mark.parametrize("spec", ["", " , ", "bad name", "ok,!bad name"])
def test_bad_selectors_are_refused(spec):
    with pytest.raises(InvalidQueueName):
        QueueSelector.parse(spec)
