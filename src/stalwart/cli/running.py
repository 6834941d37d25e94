"""Running the queue: ``work`` (one worker process) and ``supervise``."""

import argparse
import os
from typing import Any

from django.core.management.base import CommandError

from stalwart.cli import configure_logging, end_process, get_backend, reloading, subcommand
from stalwart.cli.types import (
    non_negative_int,
    poll_seconds,
    positive_int,
    queue_list,
    seconds,
    whole,
)
from stalwart.exceptions import ConfigurationError


def refuse_unsupported_settings() -> None:
    """Stop before any process starts on settings Stalwart cannot run with.

    ``queue`` skips Django's system checks (workers must start fast), so the ones that would
    make every process misbehave are repeated here.
    """
    from django.conf import settings

    from stalwart.checks import USE_TZ_HINT, USE_TZ_REQUIRED

    if not settings.USE_TZ:
        raise CommandError(f"stalwart.E003: {USE_TZ_REQUIRED} {USE_TZ_HINT}")


# -- work ------------------------------------------------------------------------------------


def _work_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--queues",
        type=queue_list,
        help="Queues to claim from, in order: names, 'prefix*', '*' for all, '!name' to "
        "exclude (default: the first worker entry of OPTIONS['workers'], else '*').",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        help="Jobs run at once, 1 to 1000 (default: OPTIONS['workers'][0]['threads'], else 5).",
    )
    parser.add_argument(
        "--poll-interval",
        type=poll_seconds,
        help="Seconds between polls when idle (default: OPTIONS['workers'][0]['poll_interval'], "
        "else 30 while listening with PostgreSQL LISTEN/NOTIFY and 0.2 otherwise).",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=seconds,
        help="Seconds running jobs get to finish after TERM/INT before they are released "
        "(default: OPTIONS['shutdown_timeout'], else 20).",
    )
    _recycling_arguments(parser)
    parser.add_argument(
        "--stop-when-empty",
        action="store_true",
        help="Exit once no job is ready or scheduled in these queues and this worker runs none.",
    )
    _reload_argument(parser)


def _reload_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reload",
        action="store_true",
        help="Start again when a Python file of the project changes, for development "
        "(running jobs finish first). Uses Django's autoreloader.",
    )


@subcommand(
    "work", "Run one worker process: claim and run jobs until TERM or INT.", _work_arguments
)
def work(command: Any, options: dict[str, Any]) -> int:
    from dataclasses import replace

    from stalwart.processes.worker import Worker

    backend = get_backend(options["backend"])
    refuse_unsupported_settings()
    if options.get("reload") and not reloading.in_child():
        return reloading.run_parent()
    configure_logging(options.get("verbosity", 1))
    config = backend.config
    if options.get("shutdown_timeout") is not None:
        config = replace(config, shutdown_timeout=options["shutdown_timeout"])
    try:
        worker_options = config.worker(
            queues=options.get("queues"),
            threads=options.get("threads"),
            poll_interval=options.get("poll_interval"),
            max_jobs=options.get("max_jobs"),
            max_memory_mb=options.get("max_memory_mb"),
        )
    except ConfigurationError as error:
        raise CommandError(str(error)) from None
    watching = options.get("reload") and reloading.in_child()
    worker = Worker(
        config=config,
        worker=worker_options,
        promote_scheduled=True,
        do_chores=True,
        stop_when_empty=options.get("stop_when_empty", False),
        owns_process=True,
        # Under --reload, the process that starts us again: if it goes, we stop.
        parent_pid=os.getppid() if watching else None,
    )
    watcher = reloading.CodeWatcher(worker.request_stop, worker.name).start() if watching else None
    try:
        status = worker.run()
    except BaseException:
        if worker.abandoned_threads:
            # Jobs were released while their threads still run: end now, not at interpreter
            # shutdown, so they never run here and elsewhere at once.
            import traceback

            traceback.print_exc()
            end_process(1, abandon_threads=True)
        raise
    if watcher is not None and watcher.changed is not None and status == 0:
        status = reloading.RELOAD_STATUS
    return end_process(status, abandon_threads=worker.abandoned_threads)


# -- supervise -------------------------------------------------------------------------------


def _supervise_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--queues",
        type=queue_list,
        help="Run one kind of worker, claiming from these queues (overrides OPTIONS['workers']).",
    )
    parser.add_argument("--threads", type=positive_int, help="Threads per worker process.")
    parser.add_argument("--processes", type=positive_int, help="Worker processes to fork.")
    _recycling_arguments(parser)
    parser.add_argument(
        "--dispatchers",
        type=non_negative_int,
        help="Dispatcher processes to fork (default: one per OPTIONS['dispatchers'] entry; "
        "that setting defaults to one entry). With 0, workers make due jobs ready themselves.",
    )
    parser.add_argument(
        "--no-scheduler", action="store_true", help="Do not fork the scheduler process."
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=seconds,
        help="Seconds running jobs get to finish after TERM/INT before they are released "
        "(default: OPTIONS['shutdown_timeout'], else 20).",
    )
    parser.add_argument(
        "--parent-pid",
        type=whole(1, 2**22),  # Linux's largest pid_max
        metavar="PID",
        help="Stop as for TERM once process PID, which started this one, is gone (for a "
        "supervisor that a web server starts: stalwart.embedded).",
    )
    _reload_argument(parser)


def _recycling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-jobs",
        type=whole(1, 10**12),
        metavar="N",
        help="Replace a worker process after it has run N jobs (supervise) or exit with "
        "status 4 (work). Default: max_jobs of OPTIONS['workers'] (its first entry for "
        "work), else no limit; given to supervise, it makes the worker entries one, as "
        "--queues does.",
    )
    parser.add_argument(
        "--max-memory-mb",
        type=whole(1, 10**7),
        metavar="MB",
        help="The same once a worker's resident memory exceeds MB megabytes. Default: "
        "max_memory_mb of OPTIONS['workers'] (its first entry for work), else no limit.",
    )


def build_slots(config: Any) -> list[Any]:
    """The children a supervisor with this configuration forks."""
    from functools import partial

    from stalwart.processes.dispatcher import Dispatcher
    from stalwart.processes.scheduler import Scheduler
    from stalwart.processes.supervisor import ChildSlot
    from stalwart.processes.worker import Worker

    # Each slot makes its child's role from the supervisor's id and pid.
    def worker(options: Any, promote: bool, supervisor: int, parent: int) -> Worker:
        return Worker(
            config=config,
            worker=options,
            supervisor=supervisor,
            parent_pid=parent,
            promote_scheduled=promote,
            owns_process=True,
        )

    def dispatcher(options: Any, supervisor: int, parent: int) -> Dispatcher:
        return Dispatcher(
            config=config,
            dispatcher=options,
            supervisor=supervisor,
            parent_pid=parent,
            owns_process=True,
        )

    def scheduler(supervisor: int, parent: int) -> Scheduler:
        return Scheduler(
            config=config,
            scheduler=config.scheduler,
            supervisor=supervisor,
            parent_pid=parent,
            owns_process=True,
        )

    slots: list[ChildSlot] = []
    # Without a dispatcher, workers make due jobs ready themselves.
    workers_promote = not config.dispatchers
    for worker_options in config.workers:
        for _ in range(worker_options.processes):
            slots.append(
                ChildSlot("worker", len(slots), partial(worker, worker_options, workers_promote))
            )
    for dispatcher_options in config.dispatchers:
        slots.append(ChildSlot("dispatcher", len(slots), partial(dispatcher, dispatcher_options)))
    if config.scheduler is not None:
        slots.append(ChildSlot("scheduler", len(slots), scheduler))
    return slots


def supervised_config(config: Any, options: dict[str, Any]) -> Any:
    """The configuration with command-line overrides applied."""
    from dataclasses import replace

    from stalwart.conf import DispatcherOptions

    changes: dict[str, Any] = {}
    if options.get("shutdown_timeout") is not None:
        changes["shutdown_timeout"] = options["shutdown_timeout"]
    worker_overrides = {
        key: options.get(key)
        for key in ("queues", "threads", "processes", "max_jobs", "max_memory_mb")
        if options.get(key) is not None
    }
    if worker_overrides:
        changes["workers"] = (config.worker(**worker_overrides),)
    if options.get("dispatchers") is not None:
        base = config.dispatchers[0] if config.dispatchers else DispatcherOptions()
        changes["dispatchers"] = (base,) * options["dispatchers"]
    if options.get("no_scheduler"):
        changes["scheduler"] = None
    return replace(config, **changes)


@subcommand(
    "supervise",
    "Run the supervisor: fork workers, dispatchers and the scheduler, and keep them running.",
    _supervise_arguments,
)
def supervise(command: Any, options: dict[str, Any]) -> int:
    from stalwart.processes.supervisor import Supervisor

    backend = get_backend(options["backend"])
    refuse_unsupported_settings()
    config = supervised_config(backend.config, options)
    refuse_broken_recurring(config)
    if options.get("reload") and not reloading.in_child():
        return reloading.run_parent()
    configure_logging(options.get("verbosity", 1))
    watching = options.get("reload") and reloading.in_child()
    parent = os.getppid() if watching else options.get("parent_pid")
    supervisor = Supervisor(
        config=config, slots=build_slots(config), owns_process=True, parent_pid=parent
    )
    watcher = (
        reloading.CodeWatcher(supervisor.request_stop, supervisor.name).start()
        if watching
        else None
    )
    status = supervisor.run()
    if watcher is not None and watcher.changed is not None and status == 0:
        status = reloading.RELOAD_STATUS
    # Its children are gone and its last lines are queued: end within the stop's bound.
    return end_process(status, abandon_threads=False, at_once=True)


def refuse_broken_recurring(config: Any) -> None:
    """The scheduler does not start with recurring entries it cannot read (stalwart.E006):
    neither does the supervisor that would fork it, unless told to go without it."""
    if config.scheduler is None or not config.recurring_errors:
        return
    raise CommandError(
        "The scheduler cannot start: "
        + " ".join(config.recurring_errors)
        + " Fix OPTIONS['recurring'], or start without the scheduler (--no-scheduler)."
    )
