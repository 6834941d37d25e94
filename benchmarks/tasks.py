"""The benchmark's tasks: as cheap as a task can be, and one that writes one row."""

import time

from django.tasks import task


@task
def noop() -> None:
    return None


@task
def stamp() -> float:
    """Return the wall-clock time at which the job ran."""
    return time.time()


def write_record() -> None:
    """The body of the one-insert jobs, the same for Stalwart's and the bare worker's."""
    from benchmarks.models import Record

    Record.objects.create(value=1, note="written by a benchmark job")


@task
def insert_one() -> None:
    write_record()
