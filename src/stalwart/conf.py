"""Settings: ``TASKS[alias]["OPTIONS"]``, read once into frozen dataclasses and validated.

Every error names the setting it is about, e.g. ``TASKS['default']['OPTIONS']['workers'][0]
['threads'] must be a whole number from 1 to 1000, not 0``.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, overload

from stalwart import deadlines
from stalwart.exceptions import ConfigurationError, InvalidQueueName
from stalwart.queues import QueueSelector
from stalwart.recurring import RecurringTask, read_recurring_apart

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOptions:
    """One kind of worker process: which queues it claims from, with how many threads."""

    queues: QueueSelector = field(default_factory=lambda: QueueSelector.parse("*"))
    threads: int = 5
    processes: int = 1
    # None: 30 s while listening (PostgreSQL's LISTEN/NOTIFY wakes it), 0.2 s else
    poll_interval: float | None = None
    max_jobs: int | None = None  # recycle the process after this many jobs
    max_memory_mb: int | None = None  # recycle the process above this resident memory


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatcherOptions:
    """A dispatcher process: makes due jobs ready, prunes dead processes."""

    polling_interval: float = 1.0  # seconds between looks for due scheduled jobs
    batch_size: int = 500  # jobs made ready per statement
    # With LISTEN/NOTIFY: the longest wait for a notification or the next due job.
    listen_timeout: float = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerOptions:
    """The scheduler process: turns recurring tasks into jobs."""

    # It wakes when its next tick is due, and looks at least this often whatever.
    polling_interval: float = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """Everything a Stalwart backend is configured with."""

    alias: str = "default"
    database: str = "default"
    workers: tuple[WorkerOptions, ...] = (WorkerOptions(),)
    dispatchers: tuple[DispatcherOptions, ...] = (DispatcherOptions(),)
    scheduler: SchedulerOptions | None = field(default_factory=SchedulerOptions)
    recurring: tuple["RecurringTask", ...] = ()
    # Entries of OPTIONS["recurring"] that cannot be read, each a sentence naming the entry:
    # reported by the system check stalwart.E006; the scheduler will not start with them.
    recurring_errors: tuple[str, ...] = ()
    # Modules of tasks outside the installed apps' tasks modules, imported before any task
    # path is resolved (a task path read from the database is never imported itself).
    task_modules: tuple[str, ...] = ()
    heartbeat_interval: float = 10.0
    process_alive_threshold: float = 60.0
    # The queue's own connections: no statement runs longer, no lock is waited on longer.
    statement_timeout: float = 10.0
    lock_timeout: float = 1.0
    # Under the 30 s grace that Heroku and Kubernetes give a stopping process, with room
    # for the supervisor to release what is left.
    shutdown_timeout: float = 20.0
    max_arguments_size: int = MIB
    max_attempts: int = 5
    # Interruptions a job may suffer for free (an outage, a stop, a neighbour's crash): past
    # them, each is charged as a failed attempt (see ``Death``).
    max_interruptions: int = 10
    # How long a job whose task a worker cannot find waits for a worker that has it (a
    # rolling deploy), before it fails with TaskNotFound.
    task_not_found_grace: float = 900.0
    listen_notify: bool = True  # False when behind a pooler with no listen_database
    # The database is reached through a pooler in transaction mode (PgBouncer): no session
    # state on its connections; LISTEN only on listen_database, a direct connection.
    transaction_pooler: bool = False
    listen_database: str | None = None
    # Finished jobs are deleted this long after they finish (None: kept for ever).
    keep_successful: timedelta | None = timedelta(days=1)
    keep_failed: timedelta | None = timedelta(days=7)
    keep_cancelled: timedelta | None = timedelta(days=7)
    # Count events into stalwart_counter, for the metrics endpoint's counters and histogram.
    metrics: bool = False

    def worker(self, **overrides: Any) -> WorkerOptions:
        """The first worker configuration, with command-line overrides applied."""
        base = self.workers[0] if self.workers else WorkerOptions()
        changes = {key: value for key, value in overrides.items() if value is not None}
        return replace(base, **changes)


class _Reader:
    """Reads one mapping of settings, naming each key it complains about."""

    def __init__(self, values: Mapping[str, Any], where: str) -> None:
        if not isinstance(values, Mapping):
            raise ConfigurationError(f"{where} must be a dict, not {type(values).__name__}.")
        self.values = values
        self.where = where
        self.used: set[str] = set()

    def name(self, key: str) -> str:
        return f"{self.where}[{key!r}]"

    def get(self, key: str, default: Any) -> Any:
        self.used.add(key)
        return self.values.get(key, default)

    def number(self, key: str, default: float, *, minimum: float, maximum: float) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigurationError(f"{self.name(key)} must be a number, not {value!r}.")
        if not minimum <= value <= maximum:
            raise ConfigurationError(
                f"{self.name(key)} must be between {minimum} and {maximum}, not {value!r}."
            )
        return float(value)

    @overload
    def whole(self, key: str, default: int, *, minimum: int, maximum: int) -> int: ...
    @overload
    def whole(self, key: str, default: None, *, minimum: int, maximum: int) -> int | None: ...
    def whole(self, key: str, default: int | None, *, minimum: int, maximum: int) -> int | None:
        value = self.get(key, default)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise ConfigurationError(
                f"{self.name(key)} must be a whole number from {minimum} to {maximum}, "
                f"not {value!r}."
            )
        return value

    def choice(self, key: str, default: Any, check: Callable[[Any], object], expected: str) -> Any:
        value = self.get(key, default)
        if not check(value):
            raise ConfigurationError(f"{self.name(key)} must be {expected}, not {value!r}.")
        return value

    def finish(self) -> None:
        unknown = sorted(set(self.values) - self.used)
        if unknown:
            raise ConfigurationError(
                f"{self.name(unknown[0])} is not a Stalwart setting "
                f"(known: {', '.join(sorted(self.used))})."
            )


def _read_worker(values: Mapping[str, Any], where: str) -> WorkerOptions:
    reader = _Reader(values, where)
    queues = reader.get("queues", "*")
    try:
        selector = QueueSelector.parse(queues)
    except (InvalidQueueName, AttributeError, TypeError) as error:
        raise ConfigurationError(f"{reader.name('queues')} is invalid: {error}") from None
    poll = reader.get("poll_interval", None)
    if poll is not None:
        poll = reader.number("poll_interval", 1.0, minimum=0.01, maximum=3600)
    worker = WorkerOptions(
        queues=selector,
        threads=reader.whole("threads", 5, minimum=1, maximum=1000),
        processes=reader.whole("processes", 1, minimum=1, maximum=1000),
        poll_interval=poll,
        max_jobs=reader.whole("max_jobs", None, minimum=1, maximum=10**12),
        max_memory_mb=reader.whole("max_memory_mb", None, minimum=1, maximum=10**7),
    )
    reader.finish()
    return worker


def _read_dispatcher(values: Mapping[str, Any], where: str) -> DispatcherOptions:
    reader = _Reader(values, where)
    dispatcher = DispatcherOptions(
        polling_interval=reader.number("polling_interval", 1.0, minimum=0.01, maximum=3600),
        batch_size=reader.whole("batch_size", 500, minimum=1, maximum=100_000),
        listen_timeout=reader.number("listen_timeout", 30.0, minimum=0.01, maximum=3600),
    )
    reader.finish()
    return dispatcher


def _read_scheduler(values: Any, where: str) -> SchedulerOptions | None:
    if values is False or values is None:
        return None
    if values is True:
        values = {}
    reader = _Reader(values, where)
    scheduler = SchedulerOptions(
        polling_interval=reader.number("polling_interval", 30.0, minimum=0.01, maximum=3600),
    )
    reader.finish()
    return scheduler


def _read_retention(reader: "_Reader", status: str, default: timedelta) -> timedelta | None:
    values = reader.get("retention", {})
    where = reader.name("retention")
    if not isinstance(values, Mapping):
        raise ConfigurationError(f"{where} must be a dict, not {values!r}.")
    unknown = sorted(set(values) - {"successful", "failed", "cancelled"})
    if unknown:
        raise ConfigurationError(
            f"{where}[{unknown[0]!r}] is not a Stalwart setting "
            "(known: 'cancelled', 'failed', 'successful')."
        )
    value = values.get(status, default)
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 <= seconds <= 100 * 365 * 86400
    ):
        raise ConfigurationError(
            f"{where}[{status!r}] must be seconds (0 to 100 years), a timedelta or None, "
            f"not {value!r}."
        )
    return timedelta(seconds=seconds)


def _read_timeouts(reader: "_Reader", interval: float, threshold: float) -> tuple[float, float]:
    """``statement_timeout`` and ``lock_timeout`` of the queue's own connections, and the
    check that the liveness deadlines hold with them (``stalwart.deadlines``).

    By default 10 s and 1 s, each capped: a statement must be cancelled well before its
    process would be taken for stalled (half of ``process_alive_threshold``), so at most a
    quarter of it; a lock wait at most as long as a statement. And a healthy process must
    survive a failed heartbeat and a slow one (``stalwart.deadlines``): settings that do not
    are refused, with the values that would.
    """
    ceiling = threshold / 4
    statement = reader.get("statement_timeout", None)
    by_default = statement is None
    if statement is None:
        statement = deadlines.default_statement_timeout(threshold)
    else:
        statement = reader.number("statement_timeout", 10.0, minimum=0.01, maximum=86400)
        if statement > ceiling:
            raise ConfigurationError(
                f"{reader.name('statement_timeout')} ({statement:g} s) must be at most a "
                f"quarter of {reader.name('process_alive_threshold')} ({threshold:g} s), so "
                "that a statement that hangs is cancelled before its process is taken for "
                "stalled."
            )
    wrong = deadlines.problem(interval, threshold, statement, by_default=by_default)
    if wrong is not None:
        raise ConfigurationError(
            f"{reader.name('process_alive_threshold')} ({threshold:g} s) {wrong}."
        )
    lock = reader.get("lock_timeout", None)
    if lock is None:
        lock = min(1.0, statement / 2)
    else:
        lock = reader.number("lock_timeout", 1.0, minimum=0.01, maximum=86400)
        if lock > statement:
            raise ConfigurationError(
                f"{reader.name('lock_timeout')} ({lock:g} s) must be at most "
                f"{reader.name('statement_timeout')} ({statement:g} s)."
            )
    return statement, lock


def _read_wakeups(reader: "_Reader") -> dict[str, Any]:
    """``listen_notify``, ``transaction_pooler`` and ``listen_database``. Behind a pooler in
    transaction mode, LISTEN works only on a direct connection (``listen_database``); without
    one, nobody could hear a notification: none is sent, and workers poll."""
    listen_notify = reader.choice(
        "listen_notify", True, lambda v: isinstance(v, bool), "True or False"
    )
    pooler = reader.choice(
        "transaction_pooler", False, lambda v: isinstance(v, bool), "True or False"
    )
    listen_database = reader.choice(
        "listen_database",
        None,
        lambda v: v is None or (isinstance(v, str) and v),
        "a database alias or None",
    )
    return {
        "listen_notify": listen_notify and (not pooler or listen_database is not None),
        "transaction_pooler": pooler,
        "listen_database": listen_database,
    }


def _read_task_modules(reader: "_Reader") -> tuple[str, ...]:
    values = reader.get("task_modules", [])
    where = reader.name("task_modules")
    if not isinstance(values, list | tuple):
        raise ConfigurationError(f"{where} must be a list of dotted module names, not {values!r}.")
    for index, module in enumerate(values):
        if not isinstance(module, str) or not all(
            part.isidentifier() for part in module.split(".")
        ):
            raise ConfigurationError(
                f"{where}[{index}] must be a dotted module name such as 'reports.jobs', "
                f"not {module!r}."
            )
    return tuple(values)


def read_options(alias: str, params: Mapping[str, Any]) -> Options:
    """Read ``TASKS[alias]["OPTIONS"]`` into an ``Options``; raise ``ConfigurationError``."""
    reader = _Reader(params.get("OPTIONS", {}), f"TASKS[{alias!r}]['OPTIONS']")
    workers_value = reader.choice(
        "workers",
        [{}],
        lambda value: isinstance(value, list | tuple) and len(value) > 0,
        "a non-empty list of dicts",
    )
    workers = tuple(
        _read_worker(entry, f"{reader.name('workers')}[{index}]")
        for index, entry in enumerate(workers_value)
    )
    dispatchers_value = reader.choice(
        "dispatchers", [{}], lambda value: isinstance(value, list | tuple), "a list of dicts"
    )
    dispatchers = tuple(
        _read_dispatcher(entry, f"{reader.name('dispatchers')}[{index}]")
        for index, entry in enumerate(dispatchers_value)
    )
    scheduler = _read_scheduler(reader.get("scheduler", True), reader.name("scheduler"))
    from django.conf import settings

    recurring, recurring_errors = read_recurring_apart(
        reader.get("recurring", None),
        reader.name("recurring"),
        getattr(settings, "TIME_ZONE", None) or "UTC",
    )
    heartbeat = reader.number("heartbeat_interval", 10.0, minimum=0.05, maximum=3600)
    threshold = reader.number("process_alive_threshold", 60.0, minimum=0.2, maximum=86400)
    statement_timeout, lock_timeout = _read_timeouts(reader, heartbeat, threshold)
    options = Options(
        alias=alias,
        database=reader.choice(
            "database", "default", lambda v: isinstance(v, str) and v, "a database alias"
        ),
        workers=workers,
        dispatchers=dispatchers,
        scheduler=scheduler,
        recurring=recurring,
        recurring_errors=recurring_errors,
        task_modules=_read_task_modules(reader),
        heartbeat_interval=heartbeat,
        process_alive_threshold=threshold,
        statement_timeout=statement_timeout,
        lock_timeout=lock_timeout,
        shutdown_timeout=reader.number("shutdown_timeout", 20.0, minimum=0, maximum=86400),
        max_arguments_size=reader.whole("max_arguments_size", MIB, minimum=64, maximum=256 * MIB),
        max_attempts=reader.whole("max_attempts", 5, minimum=1, maximum=1000),
        max_interruptions=reader.whole("max_interruptions", 10, minimum=0, maximum=1000),
        task_not_found_grace=reader.number(
            "task_not_found_grace", 900.0, minimum=0, maximum=30 * 86400
        ),
        **_read_wakeups(reader),
        keep_successful=_read_retention(reader, "successful", timedelta(days=1)),
        keep_failed=_read_retention(reader, "failed", timedelta(days=7)),
        keep_cancelled=_read_retention(reader, "cancelled", timedelta(days=7)),
        metrics=reader.choice("metrics", False, lambda v: isinstance(v, bool), "True or False"),
    )
    reader.finish()
    return options
