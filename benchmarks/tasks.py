"""The benchmark's tasks: as cheap as a task can be."""

import time

from django.tasks import task


@task
def noop() -> None:
    return None


@task
def stamp() -> float:
    """Return the wall-clock time at which the job ran."""
    return time.time()
