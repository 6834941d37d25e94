"""The records the statements take and return: a job to insert, a job claimed, an attempt's
outcome, a job taken back from its process; and the columns a claim reads and an insert
writes."""

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

# The columns a claim returns: everything needed to run the job and report its result.
CLAIM_COLUMNS = (
    "id",
    "task_path",
    "backend",
    "queue_name",
    "priority",
    "args",
    "kwargs",
    "run_after",
    "enqueued_at",
    "started_at",
    "last_attempted_at",
    "attempt",
    "max_attempts",
    "worker_ids",
    "errors",
    "concurrency_key",
    "isolated",
    "unique_key",
    "cancel_requested_at",
    "has_dependants",
)

# The columns an insert writes from each new job, in the order of insert_params()...
INSERT_COLUMNS = (
    "id",
    "task_path",
    "backend",
    "queue_name",
    "priority",
    "status",
    "args",
    "kwargs",
    "run_after",
    "available_at",
    "enqueued_at",
    "max_attempts",
    "concurrency_key",
    "concurrency_limit",
    "concurrency_duration",
    "unique_key",
    "unique_while_running",
    "max_interruptions",
)
# ...and those in which every new job starts alike, with these SQL literals.
INSERT_CONSTANTS = {"attempt": "0", "worker_ids": "'[]'", "errors": "'[]'", "interruptions": "'[]'"}


# Not frozen, though nothing changes one once made: a bulk enqueue makes thousands, and a
# frozen dataclass is made three times slower (each field set through object.__setattr__).
@dataclass(slots=True)
class NewJob:
    """A row to insert. ``args`` and ``kwargs`` are already encoded JSON."""

    id: uuid.UUID
    task_path: str
    backend: str
    queue_name: str
    priority: int
    status: str
    args: str
    kwargs: str
    run_after: datetime | None
    available_at: datetime
    enqueued_at: datetime
    max_attempts: int
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    concurrency_duration: float | None = None
    unique_key: str | None = None
    unique_while_running: bool = False
    max_interruptions: int = 10


# Not frozen either, though nothing changes one once claimed: a worker makes one per job
# it runs, and nineteen fields set through object.__setattr__ cost 2 µs a job.
@dataclass(slots=True)
class ClaimedJob:
    """A job as one claim handed it to one process, for one attempt."""

    id: uuid.UUID
    task_path: str
    backend: str
    queue_name: str
    priority: int
    args: list
    kwargs: dict
    run_after: datetime | None
    enqueued_at: datetime
    started_at: datetime
    last_attempted_at: datetime
    attempt: int
    max_attempts: int
    worker_ids: list
    errors: list
    concurrency_key: str | None = None
    # It must run alone: it was running when a process died beside other jobs.
    isolated: bool = False
    unique_key: str | None = None
    # Someone asked the job to stop while an earlier attempt ran: it is not run again.
    cancel_requested_at: datetime | None = None
    # Some job ran after this one when it was claimed: its worker releases them once its
    # outcome is written (a dependant added later is the dispatcher's to release).
    has_dependants: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one attempt, to be written if (and only if) we still own it.

    ``status`` is the new state; ``retry_in`` is set when the job goes back to waiting (a
    retry): the seconds to wait, counted from the database's clock when the outcome is
    written; ``errors`` is the whole new error list (encoded), or None to leave it as is.
    ``keep_owner``: the attempt may still be running in a thread of ours (it timed out), so
    the job stays ours, and is not made ready again, until our process row is gone.
    """

    id: uuid.UUID
    attempt: int
    status: str
    return_value: str | None = None
    errors: str | None = None
    retry_in: float | None = None
    keep_owner: bool = False


class Death(StrEnum):
    """How the process whose jobs are taken back came to an end, which decides who pays
    (docs/explanation/processes.md, "Who pays for a death"). By cause, not by exit path.

    A job charged gets the death as an error and counts it towards ``max_attempts``. A job
    not charged has the death recorded as an interruption: free, up to its
    ``max_interruptions``; past those, an interruption is charged too. So no job is claimed
    more than ``max_attempts + max_interruptions`` times.
    """

    #: The queue or its environment ended the attempts, not a job: a stop past its timeout,
    #: an outage or a stall of the queue's own loop, a fence, a deploy. Nobody is charged.
    INTERRUPTED = "interrupted"
    #: A job may have caused it (a signal, a crash, a task's ``os._exit``, memory, a stall
    #: of the whole process, a silence nobody explained): among the suspects (by default
    #: every job it held), one alone is charged; several are each isolated, to run alone
    #: next time, where a death can only be its own, and are not charged.
    CRASH = "crash"


@dataclass(frozen=True, slots=True)
class Interruption:
    """A job a live process gives back, and why: its attempt ended through no fault of its
    own (a stop, a lost connection, a claim whose answer was lost). Free, unless the job has
    used up its ``max_interruptions``: then it is charged, with ``error_class`` and
    ``error_text`` (by default the cause) as its error."""

    id: uuid.UUID
    attempt: int
    cause: str
    error_class: str = "stalwart.exceptions.JobInterrupted"
    error_text: str | None = None

    @property
    def error(self) -> str:
        return self.error_text if self.error_text is not None else self.cause


@dataclass(frozen=True, slots=True)
class Released:
    """A job taken back from its process: now ready again, blocked (its concurrency slot
    can expire, so it waits to be handed one again), or failed for good."""

    id: uuid.UUID
    status: str
    queue_name: str
    concurrency_key: str | None = None
    task_path: str = ""
    # Whether the attempt that ended was charged (a failed attempt), or was an interruption.
    charged: bool = False

    @property
    def failed(self) -> bool:
        """Failed for good (that was its last attempt); otherwise it will run again."""
        return self.status == "failed"
