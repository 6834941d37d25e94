"""The job table: one row per enqueued call, one state column."""

from django.db import models
from django.tasks import TaskResultStatus


class JobStatus(models.TextChoices):
    """A job is in exactly one of these states; see docs/explanation/state-machine.md."""

    PENDING = "pending", "Pending"  # waiting for the jobs it runs after (enqueue_after)
    SCHEDULED = "scheduled", "Scheduled"  # waiting for its time (run_after, retry delay)
    BLOCKED = "blocked", "Blocked"  # waiting for a concurrency slot
    READY = "ready", "Ready"  # claimable now
    RUNNING = "running", "Running"  # claimed by a process (owner) for one attempt
    SUCCESSFUL = "successful", "Successful"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"  # by a person, before it ran (or on its request)

    @property
    def task_result_status(self) -> TaskResultStatus:
        """The ``django.tasks`` status this state is reported as."""
        return _TASK_RESULT_STATUS[self]


_TASK_RESULT_STATUS = {
    JobStatus.PENDING: TaskResultStatus.READY,
    JobStatus.SCHEDULED: TaskResultStatus.READY,
    JobStatus.BLOCKED: TaskResultStatus.READY,
    JobStatus.READY: TaskResultStatus.READY,
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.SUCCESSFUL: TaskResultStatus.SUCCESSFUL,
    JobStatus.FAILED: TaskResultStatus.FAILED,
    # Django's statuses have no "cancelled"; FAILED is the one that says "finished, and the
    # task did not (or was unable to) complete", so callers waiting on is_finished stop.
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
}

# The states a job can be cancelled from at once (it is waiting, no worker holds it).
CANCELLABLE_STATES = ("pending", "scheduled", "blocked", "ready")
# The states in which a job has ended: retention deletes them.
FINISHED_STATES = ("successful", "failed", "cancelled")


# The states in which a job holds its unique key: it excludes another job with the same
# key. A job waiting for its parents (pending) holds it like any waiting job. The unique
# index's condition (a migration's, and MySQL's ``unique_holder`` column, written by
# 0018_pending_holds_unique_key): a change here needs a migration of both.
HOLDING_STATES = ("pending", "scheduled", "blocked", "ready")
UNIQUE_STATES = models.Q(unique_key__isnull=False) & (
    models.Q(status__in=list(HOLDING_STATES))
    | models.Q(status="running", unique_while_running=True)
)


class Job(models.Model):
    """A task call. The hot statements on this table live in ``stalwart.db``."""

    id = models.UUIDField(primary_key=True, editable=False)
    task_path = models.CharField(max_length=255)
    backend = models.CharField(max_length=64, default="default")
    queue_name = models.CharField(max_length=64, default="default")
    priority = models.SmallIntegerField(default=0)
    status = models.CharField(max_length=16, choices=JobStatus.choices)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    # When the caller asked the job to run (None: as soon as possible).
    run_after = models.DateTimeField(null=True, blank=True)
    # When the job became (or becomes) claimable: the claim orders by it within a priority.
    available_at = models.DateTimeField()
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Claims so far; the claim increments it, and finishing is fenced on it.
    attempt = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=5)
    # The process row that holds the job while it runs (no foreign key: process rows are
    # deleted when pruned, and the fencing must outlive them).
    owner = models.BigIntegerField(null=True, blank=True)
    worker_ids = models.JSONField(default=list)
    errors = models.JSONField(default=list)
    return_value = models.JSONField(null=True, blank=True)
    # Concurrency limit: jobs with one key hold its slots while ready or running.
    # NULL, not "", means "no key": partial indexes leave NULL keys out.
    concurrency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)
    # Seconds after the start of an attempt at which a running job's slot counts as free.
    concurrency_duration = models.FloatField(null=True, blank=True)
    # Uniqueness: at most one waiting job (and, if asked, running job) per key.
    unique_key = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    unique_while_running = models.BooleanField(default=False, db_default=False)
    # The job was running when its process died with other jobs beside it. Which one killed
    # the process is unknown, so none is charged for the death; each runs alone next time,
    # where a death can only be its own. Cleared once an attempt ends.
    isolated = models.BooleanField(default=False, db_default=False)
    # Someone asked this job to stop while it ran (``stalwart.cancel``): its worker tells
    # the task through its context, and the job never starts another attempt.
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # Attempts that ended through no fault of the job (an outage, a stop, a neighbour's
    # crash, a fence it did not cause), one entry each: {"attempt", "cause", "at",
    # "process"}. They are free, up to ``max_interruptions``; past that, each is charged as
    # a failed attempt. So a job is never claimed more than max_attempts + max_interruptions
    # times (docs/explanation/processes.md, "Who pays for a death").
    interruptions = models.JSONField(default=list, db_default=[])
    max_interruptions = models.PositiveIntegerField(default=10, db_default=10)
    # Since when workers have claimed the job without finding its task (a rolling deploy:
    # an old worker, a task added in the new release). Such a claim is undone, and the job
    # waits for a worker that has the task, up to the backend's ``task_not_found_grace``.
    unresolved_since = models.DateTimeField(null=True, blank=True)
    # Some job runs after this one (``enqueue_after``): set with the dependant, read by the
    # claim, so the worker that finishes this job releases its dependants at once; a job
    # without any costs its worker nothing more.
    has_dependants = models.BooleanField(default=False, db_default=False)

    class Meta:
        db_table = "stalwart_job"
        constraints = [
            models.UniqueConstraint(
                fields=["unique_key"],
                condition=UNIQUE_STATES,
                name="stalwart_job_unique_waiting",
            ),
            # Django's range, checked by the database too: rows are written by hand as well.
            models.CheckConstraint(
                condition=models.Q(priority__gte=-100, priority__lte=100),
                name="stalwart_job_priority_range",
            ),
        ]
        indexes = [
            # The claim: ORDER BY priority DESC, available_at, id within one queue...
            models.Index(
                fields=["queue_name", "-priority", "available_at", "id"],
                condition=models.Q(status="ready"),
                name="stalwart_job_claim_queue",
            ),
            # ...or across every queue (workers on '*'). Its condition names the priority (true
            # of every job: the range is checked) so that only a claim that says so, the one
            # on every queue, can read it: a claim on some queues never picks it to filter
            # out the others, whatever the statistics say.
            models.Index(
                fields=["-priority", "available_at", "id"],
                condition=models.Q(status="ready", priority__gte=-100),
                name="stalwart_job_claim_any",
            ),
            # Jobs waiting for their parents: the dispatcher's look at which it may release.
            models.Index(
                fields=["id"],
                condition=models.Q(status="pending"),
                name="stalwart_job_pending",
            ),
            # Jobs that others run after, by when they finished: the dispatcher's look at the
            # dependants of jobs finished since its last one reads these alone, not every job
            # that finished meanwhile (a busy queue finishes thousands a second).
            models.Index(
                fields=["finished_at"],
                condition=models.Q(has_dependants=True),
                name="stalwart_job_parents",
            ),
            # Scheduled jobs that fall due.
            models.Index(
                fields=["available_at"],
                condition=models.Q(status="scheduled"),
                name="stalwart_job_due",
            ),
            # Jobs held by a process: release when it dies.
            models.Index(
                fields=["owner"],
                condition=models.Q(status="running"),
                name="stalwart_job_owner",
            ),
            # Blocked jobs by key, in the order slots are handed out.
            models.Index(
                fields=["concurrency_key", "-priority", "available_at", "id"],
                condition=models.Q(status="blocked"),
                name="stalwart_job_blocked",
            ),
            # Slot holders: keyed jobs that are ready or running.
            models.Index(
                fields=["concurrency_key"],
                condition=models.Q(status__in=["ready", "running"], concurrency_key__isnull=False),
                name="stalwart_job_slot_holders",
            ),
            # Isolated ready jobs (rare: after a crash), which a worker looks for each poll.
            models.Index(
                fields=["queue_name"],
                condition=models.Q(status="ready", isolated=True),
                name="stalwart_job_isolated",
            ),
            # Failed jobs by queue (status pages, retry and discard in bulk).
            models.Index(
                fields=["queue_name", "finished_at"],
                condition=models.Q(status="failed"),
                name="stalwart_job_failed",
            ),
            # Failed jobs by task (the dashboard's filter, retry and discard by task).
            models.Index(
                fields=["task_path", "finished_at"],
                condition=models.Q(status="failed"),
                name="stalwart_job_failed_task",
            ),
            # Failed jobs in id order: a retry or a discard of many goes through them in
            # batches, each from where the last one ended, reading no other rows.
            models.Index(
                fields=["id"],
                condition=models.Q(status="failed"),
                name="stalwart_job_failed_id",
            ),
            # Queues with scheduled or blocked jobs, one descent each (``--stop-when-empty``).
            models.Index(
                fields=["queue_name"],
                condition=models.Q(status__in=["scheduled", "blocked"]),
                name="stalwart_job_waiting_queue",
            ),
            # Jobs with a unique key, whatever their state: a retry or a run-now checks that
            # no twin goes back to waiting before it (without this index, PostgreSQL's
            # planner prices that check as a scan per job, and compiles the query (JIT) for
            # longer than it then runs).
            models.Index(
                fields=["unique_key", "id"],
                condition=models.Q(unique_key__isnull=False),
                name="stalwart_job_unique_key",
            ),
            # Finished jobs by age: retention, and the dashboard's lists of finished jobs
            # (newest first, keyset-paginated on finished_at and id). With partial indexes, a
            # claim or a success costs two index insertions (the primary key and one
            # partial index).
            models.Index(
                fields=["status", "finished_at", "id"],
                condition=models.Q(status__in=["successful", "failed", "cancelled"]),
                name="stalwart_job_finished",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} [{self.status}] {self.id}"
