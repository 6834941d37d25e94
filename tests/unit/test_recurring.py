"""Recurring schedules: parsing, due ticks and daylight-saving changes (computed, not waited)."""

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from stalwart.exceptions import ConfigurationError
from stalwart.recurring import MAX_REPLAY, RecurringTask, read_entry, read_recurring

PARIS = ZoneInfo("Europe/Paris")
WHERE = "TASKS['default']['OPTIONS']['recurring']"


def entry(schedule: str, zone: str = "Europe/Paris", **extra) -> RecurringTask:
    return read_entry(
        "report",
        {"task": "app.tasks.report", "schedule": schedule, "timezone": zone, **extra},
        f"{WHERE}['report']",
        "UTC",
    )


def local(*args: int) -> datetime:
    return datetime(*args, tzinfo=PARIS)


def ticks_between(task: RecurringTask, start: datetime, end: datetime) -> list[datetime]:
    result = []
    for tick in task.ticks_after(start):
        if tick > end:
            return result
        result.append(tick)
    return result


@pytest.mark.parametrize(
    ("day", "expected_local"),
    [
        # Spring forward: 02:00 becomes 03:00, so 02:30 does not exist that day.
        ((2026, 3, 29), [(2026, 3, 28, 2, 30), (2026, 3, 29, 3, 0), (2026, 3, 30, 2, 30)]),
        # Fall back: 02:00-03:00 happens twice; the job runs at the first 02:30 only.
        ((2026, 10, 25), [(2026, 10, 24, 2, 30), (2026, 10, 25, 2, 30), (2026, 10, 26, 2, 30)]),
    ],
)
def test_a_daily_task_runs_once_on_each_daylight_saving_change_day(day, expected_local):
    task = entry("30 2 * * *")
    start = local(*day) - timedelta(days=1, hours=12)
    ticks = ticks_between(task, start, start + timedelta(days=3))
    assert [tick.astimezone(PARIS).timetuple()[:5] for tick in ticks] == expected_local
    assert len({tick.astimezone(PARIS).date() for tick in ticks}) == 3
    # One tick per day, never two an hour apart on the day of the change.
    gaps = [later - earlier for earlier, later in itertools.pairwise(ticks)]
    assert all(timedelta(hours=22) <= gap <= timedelta(hours=26) for gap in gaps)


def test_an_hourly_task_follows_real_hours_across_the_change():
    task = entry("@hourly")
    ticks = ticks_between(task, local(2026, 3, 29, 0, 30), local(2026, 3, 29, 4, 30))
    assert [tick.astimezone(PARIS).hour for tick in ticks] == [1, 3, 4]  # 02:00 never happens


def test_the_next_run_comes_from_the_previous_one_not_the_clock():
    task = entry("*/15 * * * *", "UTC")
    previous = datetime(2026, 1, 1, 10, 15, tzinfo=UTC)
    assert task.next_after(previous) == datetime(2026, 1, 1, 10, 30, tzinfo=UTC)
    # However late the scheduler looks, the schedule does not drift.
    late_now = datetime(2026, 1, 1, 10, 31, 59, tzinfo=UTC)
    assert task.due(since=previous, now=late_now) == [datetime(2026, 1, 1, 10, 30, tzinfo=UTC)]


@pytest.mark.parametrize(
    ("nickname", "expression"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_nicknames(nickname, expression):
    assert entry(nickname).expression == expression


def test_six_fields_put_seconds_first():
    task = entry("*/20 * * * * *", "UTC")
    start = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    assert [tick.second for tick in ticks_between(task, start, start + timedelta(seconds=60))] == [
        20,
        40,
        0,
    ]


class TestCatchUp:
    since = datetime(2026, 1, 1, 0, 0, tzinfo=UTC)
    now = datetime(2026, 1, 1, 5, 0, 30, tzinfo=UTC)  # five hourly ticks were missed

    def test_latest_runs_the_last_missed_tick_once(self):
        assert entry("@hourly", "UTC").due(since=self.since, now=self.now) == [
            datetime(2026, 1, 1, 5, tzinfo=UTC)
        ]

    def test_all_replays_every_missed_tick_in_order(self):
        due = entry("@hourly", "UTC", catch_up="all").due(since=self.since, now=self.now)
        assert [tick.hour for tick in due] == [1, 2, 3, 4, 5]

    def test_all_is_bounded(self):
        due = entry("* * * * * *", "UTC", catch_up="all").due(
            since=self.since, now=self.since + timedelta(hours=1)
        )
        assert len(due) == MAX_REPLAY
        assert due[-1] == self.since + timedelta(hours=1)

    def test_none_skips_missed_ticks_but_runs_one_just_due(self):
        task = entry("@hourly", "UTC", catch_up="none")
        assert task.due(since=self.since, now=self.now) == [datetime(2026, 1, 1, 5, tzinfo=UTC)]
        assert task.due(since=self.since, now=self.now + timedelta(minutes=5)) == []

    def test_nothing_is_due_twice(self):
        task = entry("@hourly", "UTC")
        last = datetime(2026, 1, 1, 5, tzinfo=UTC)
        assert task.due(since=last, now=self.now) == []


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "nightly",
            {"task": "a.b", "schedule": "61 * * * *"},
            "['nightly'] has an invalid 'schedule' '61 * * * *': Bad minute.",
        ),
        (
            "nightly",
            {"task": "a.b", "schedule": "* * *"},
            "['nightly'] has an invalid 'schedule' '* * *': Wrong number of fields.",
        ),
        (
            "nightly",
            {"task": "a.b", "schedule": "@daily", "timezone": "Mars/Olympus"},
            "['nightly'] has an unknown 'timezone' 'Mars/Olympus'.",
        ),
        ("nightly", {"schedule": "@daily"}, "['nightly'] needs 'task'"),
        ("nightly", {"task": "a.b"}, "['nightly'] needs 'schedule'"),
        (
            "nightly",
            {"task": "a.b", "schedule": "@daily", "every": 3},
            "['nightly'] has an unknown setting 'every'",
        ),
        (
            "nightly",
            {"task": "a.b", "schedule": "@daily", "kwargs": {"x": float("nan")}},
            "['nightly'] has invalid arguments: kwargs['x'] is nan",
        ),
        (
            "nightly",
            {"task": "a.b", "schedule": "@daily", "queue_name": "a b"},
            "['nightly'] has an invalid 'queue_name'",
        ),
        (
            "nightly",
            {"task": "a.b", "schedule": "@daily", "priority": 500},
            "['nightly'] needs 'priority' to be a whole number from -100 to 100",
        ),
        (
            "nightly",
            {"task": "a.b", "schedule": "@daily", "catch_up": "some"},
            "['nightly'] needs 'catch_up' to be one of latest, all, none",
        ),
        ("bad key!", {"task": "a.b", "schedule": "@daily"}, "['bad key!'] has an invalid key"),
    ],
)
def test_invalid_entries_name_themselves(key, value, message):
    with pytest.raises(ConfigurationError) as caught:
        read_recurring({key: value}, WHERE, "UTC")
    assert f"{WHERE}{message}" in str(caught.value)


def test_the_default_time_zone_is_the_projects():
    (task,) = read_recurring({"r": {"task": "a.b", "schedule": "@daily"}}, WHERE, "Asia/Tokyo")
    assert task.timezone == ZoneInfo("Asia/Tokyo")
    assert task.args == []
    assert task.catch_up == "latest"
