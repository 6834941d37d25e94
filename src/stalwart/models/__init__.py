"""The tables Stalwart keeps in the application's database."""

from stalwart.models.job import Job, JobStatus
from stalwart.models.process import Process

__all__ = ["Job", "JobStatus", "Process"]
