"""The tables Stalwart keeps in the application's database."""

from stalwart.models.job import Job, JobStatus
from stalwart.models.lease import Lease
from stalwart.models.process import Process
from stalwart.models.recurring import RecurringRun

__all__ = ["Job", "JobStatus", "Lease", "Process", "RecurringRun"]
