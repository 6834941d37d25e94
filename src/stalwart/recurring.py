"""Recurring tasks: their declaration, and which ticks of their schedule are due.

A schedule is a cron expression read by ``cronsim``: five fields (minute hour day month
weekday), or six with a leading seconds field, or a nickname (``@hourly``, ``@daily``,
``@weekly``, ``@monthly``, ``@yearly``). Ticks are computed in the task's time zone, so a
daily 02:30 runs once on the day clocks jump over 02:30 (at 03:00) and once on the day they
pass it twice (the first time).
"""

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from stalwart.exceptions import ConfigurationError, InvalidTaskArguments
from stalwart.queues import validate_queue_name
from stalwart.serialization import normalize

NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
CATCH_UP_CHOICES = ("latest", "all", "none")
# With catch_up="none", a tick older than this when first seen counts as missed.
MISFIRE_GRACE = timedelta(seconds=60)
# With catch_up="all", at most this many missed ticks are enqueued at once.
MAX_REPLAY = 1000
_KEY = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RecurringTask:
    """One recurring task: which task to enqueue, on which schedule, with what."""

    key: str
    task_path: str
    schedule: str  # as written in the settings
    expression: str  # the cron expression it stands for
    timezone: ZoneInfo
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    queue_name: str | None = None
    priority: int | None = None
    catch_up: str = "latest"

    def ticks_after(self, moment: datetime) -> Iterator[datetime]:
        """Ticks strictly after ``moment``, in UTC."""
        for tick in CronSim(self.expression, moment.astimezone(self.timezone)):
            yield tick.astimezone(UTC)

    def next_after(self, moment: datetime) -> datetime | None:
        return next(self.ticks_after(moment), None)

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        local = moment.astimezone(self.timezone)
        # Reversed, cronsim starts from the given second itself only if it has a fraction.
        if not local.microsecond:
            local = local.replace(microsecond=1)
        tick = next(CronSim(self.expression, local, reverse=True), None)
        return None if tick is None else tick.astimezone(UTC)

    def due(self, *, since: datetime, now: datetime) -> list[datetime]:
        """The ticks to enqueue now, given the last one enqueued (or the start) ``since``.

        Never a burst: by default only the latest missed tick; ``all`` replays up to
        ``MAX_REPLAY``; ``none`` skips ticks older than ``MISFIRE_GRACE``.
        """
        latest = self.latest_at_or_before(now)
        if latest is None or latest <= since:
            return []
        if self.catch_up == "latest":
            return [latest]
        if self.catch_up == "none":
            return [latest] if now - latest <= MISFIRE_GRACE else []
        ticks = []
        for tick in self.ticks_after(since):
            if tick > now:
                break
            ticks.append(tick)
        return ticks[-MAX_REPLAY:]


def expand_schedule(schedule: str) -> str:
    text = " ".join(schedule.split())
    return NICKNAMES.get(text.lower(), text)


def _entry_error(where: str, message: str) -> ConfigurationError:
    return ConfigurationError(f"{where} {message}")


def read_recurring(values: Any, where: str, default_timezone: str) -> tuple[RecurringTask, ...]:
    """Read ``OPTIONS['recurring']``: a dict of key -> entry. Errors name the entry."""
    if values is None:
        return ()
    if not isinstance(values, Mapping):
        raise _entry_error(where, f"must be a dict of recurring tasks by key, not {values!r}.")
    return tuple(
        read_entry(key, entry, f"{where}[{key!r}]", default_timezone)
        for key, entry in values.items()
    )


def read_recurring_apart(
    values: Any, where: str, default_timezone: str
) -> tuple[tuple[RecurringTask, ...], tuple[str, ...]]:
    """Like ``read_recurring``, with each invalid entry set aside with its error instead.

    The settings are read wherever the backend loads, which is wherever a task is defined:
    one bad entry must not stop the site. The errors are reported by the system check
    ``stalwart.E006``, and the scheduler refuses to start with them.
    """
    if values is None:
        return (), ()
    if not isinstance(values, Mapping):
        return (), (f"{where} must be a dict of recurring tasks by key, not {values!r}.",)
    entries: list[RecurringTask] = []
    errors: list[str] = []
    for key, entry in values.items():
        try:
            entries.append(read_entry(key, entry, f"{where}[{key!r}]", default_timezone))
        except ConfigurationError as error:
            errors.append(str(error))
    return tuple(entries), tuple(errors)


def read_entry(  # noqa: PLR0912 - one check per field, in the order they are documented
    key: Any, entry: Any, where: str, default_timezone: str
) -> RecurringTask:
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise _entry_error(
            where, "has an invalid key: use 1 to 128 letters, digits, '_', '-', '.' or ':'."
        )
    if not isinstance(entry, Mapping):
        raise _entry_error(where, f"must be a dict, not {entry!r}.")
    known = {"task", "schedule", "timezone", "args", "kwargs", "queue_name", "priority", "catch_up"}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise _entry_error(
            where, f"has an unknown setting {unknown[0]!r} (known: {', '.join(sorted(known))})."
        )
    task_path = entry.get("task")
    if not isinstance(task_path, str) or "." not in task_path:
        raise _entry_error(where, f"needs 'task', the dotted path of a task, not {task_path!r}.")
    schedule = entry.get("schedule")
    if not isinstance(schedule, str):
        raise _entry_error(where, f"needs 'schedule', a cron expression, not {schedule!r}.")
    expression = expand_schedule(schedule)
    zone_name = entry.get("timezone", default_timezone)
    try:
        zone = ZoneInfo(zone_name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise _entry_error(where, f"has an unknown 'timezone' {zone_name!r}.") from None
    try:
        CronSim(expression, datetime.now(zone))
    except CronSimError as error:
        raise _entry_error(where, f"has an invalid 'schedule' {schedule!r}: {error}.") from None
    raw_args, raw_kwargs = entry.get("args", []), entry.get("kwargs", {})
    if not isinstance(raw_args, list | tuple) or not isinstance(raw_kwargs, Mapping):
        raise _entry_error(where, "needs 'args' to be a list and 'kwargs' a dict.")
    try:
        args = normalize(list(raw_args), "args")
        kwargs = normalize(dict(raw_kwargs), "kwargs")
    except InvalidTaskArguments as error:
        raise _entry_error(where, f"has invalid arguments: {error}.") from None
    queue_name = entry.get("queue_name")
    if queue_name is not None:
        try:
            validate_queue_name(queue_name)
        except ValueError as error:
            raise _entry_error(where, f"has an invalid 'queue_name': {error}") from None
    priority = entry.get("priority")
    if priority is not None and (
        isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100
    ):
        raise _entry_error(
            where, f"needs 'priority' to be a whole number from -100 to 100, not {priority!r}."
        )
    catch_up = entry.get("catch_up", "latest")
    if catch_up not in CATCH_UP_CHOICES:
        raise _entry_error(
            where, f"needs 'catch_up' to be one of {', '.join(CATCH_UP_CHOICES)}, not {catch_up!r}."
        )
    return RecurringTask(
        key=key,
        task_path=task_path,
        schedule=schedule,
        expression=expression,
        timezone=zone,
        args=args,
        kwargs=kwargs,
        queue_name=queue_name,
        priority=priority,
        catch_up=catch_up,
    )
