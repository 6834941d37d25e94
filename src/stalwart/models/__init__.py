"""The tables Stalwart keeps in the application's database."""

from stalwart.models.batch import Batch, BatchJob, BatchRole
from stalwart.models.control import ConcurrencyKey, QueuePause
from stalwart.models.counter import Counter
from stalwart.models.dashboard import Dashboard
from stalwart.models.dependency import Dependency, OnFailure
from stalwart.models.job import Job, JobStatus
from stalwart.models.lease import Lease
from stalwart.models.process import Process
from stalwart.models.recurring import RecurringRun

__all__ = [
    "Batch",
    "BatchJob",
    "BatchRole",
    "ConcurrencyKey",
    "Counter",
    "Dashboard",
    "Dependency",
    "Job",
    "JobStatus",
    "Lease",
    "OnFailure",
    "Process",
    "QueuePause",
    "RecurringRun",
]
