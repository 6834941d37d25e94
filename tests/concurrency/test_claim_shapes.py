"""Every shape a claim takes (one named queue, a prefix, every queue, every queue but the
paused ones) keeps the claim order (priority, then availability, then id), never hands out
a job of a paused queue, skips rows another transaction holds instead of waiting, and never
gives one job to two claimants."""

import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from stalwart import Call, enqueue_many
from stalwart.jobs import JobStore
from stalwart.models import Job
from stalwart.queues import QueueSelector
from tests.helpers import impatient, register_processes
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def processes():
    register_processes(*range(1, 10))


def fill() -> dict[str, list]:
    """Ready jobs in four queues, with priorities and times mixed; ids by queue."""
    start = timezone.now() - timedelta(hours=1)
    made: dict[str, list] = {}
    for number in range(24):
        queue = ("alpha", "beta", "paused", "alphabet")[number % 4]
        result = tasks.noop.using(queue_name=queue, priority=number % 3).enqueue()
        Job.objects.filter(pk=result.id).update(available_at=start + timedelta(seconds=-number))
        made.setdefault(queue, []).append(result.id)
    return made


def expected(queues: set[str], count: int) -> list[str]:
    rows = Job.objects.filter(status="ready", queue_name__in=queues)
    ordered = rows.order_by("-priority", "available_at", "id").values_list("id", flat=True)
    return [str(job_id) for job_id in ordered[:count]]


def urgency(job: Job) -> tuple:
    """The claim order (priority, then availability, then id) as a key: smallest first."""
    return (-job.priority, job.available_at, str(job.id))


def claim(selector: str, limit: int, *, owner: int = 1, paused=()) -> list[str]:
    """A claim that raises, rather than hangs, if it ever waits on a row lock."""
    with impatient():
        claimed = JobStore("default").claim(
            owner=owner,
            worker_name=f"w{owner}",
            selector=QueueSelector.parse(selector),
            limit=limit,
            paused=list(paused),
        )
    return [str(job.id) for job in claimed]


@pytest.mark.parametrize(
    ("selector", "paused", "queues"),
    [
        ("alpha", (), {"alpha"}),
        ("alpha*", (), {"alpha", "alphabet"}),
        ("*", (), {"alpha", "beta", "paused", "alphabet"}),
        ("*", ("paused",), {"alpha", "beta", "alphabet"}),
        ("*,!beta", ("paused",), {"alpha", "alphabet"}),
        ("alpha*", ("alphabet",), {"alpha"}),
    ],
)
def test_each_claim_shape_takes_the_most_urgent_jobs_of_its_queues(selector, paused, queues):
    fill()
    for _ in range(3):  # batch after batch, the order holds
        wanted = expected(queues, 4)
        took = claim(selector, 4, paused=paused)
        assert sorted(took) == sorted(wanted)
        # Checked again in Python, not by the database's ORDER BY: every job taken is of the
        # claim's queues and more urgent than every job of them still waiting.
        taken = list(Job.objects.filter(id__in=took))
        waiting = list(Job.objects.filter(status="ready", queue_name__in=queues))
        assert len(taken) == min(4, len(taken) + len(waiting))
        assert {job.queue_name for job in taken} <= queues
        assert all(urgency(job) < urgency(other) for job in taken for other in waiting)


def test_finish_and_claim_on_every_queue_but_a_paused_one_takes_the_same_jobs(vendor):
    store = JobStore("default")
    if not store.statements.can_finish_and_claim:
        pytest.skip("only PostgreSQL writes outcomes and claims in one statement")
    fill()
    wanted = expected({"alpha", "beta", "alphabet"}, 5)
    _, claimed = store.finish_and_claim(
        owner=1,
        outcomes=[],
        worker_name="w1",
        selector=QueueSelector.parse("*"),
        limit=5,
        paused=["paused"],
    )
    assert sorted(str(job.id) for job in claimed) == sorted(wanted)


def test_a_claim_around_a_paused_queue_skips_a_locked_row_instead_of_waiting(vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite has no row locks: a writer waits for the database lock instead")
    fill()
    first, second = expected({"alpha", "beta", "alphabet"}, 2)
    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute("SELECT id FROM stalwart_job WHERE id = %s FOR UPDATE", [first])
        # A wait would raise (the claim's lock timeout), not return.
        assert claim("*", 1, paused=["paused"]) == [second]
        other.rollback()
    finally:
        other.close()
    assert claim("*", 1, owner=2, paused=["paused"]) == [first]


@pytest.mark.parametrize("selector", ["alpha", "alpha*", "*"])
def test_many_threads_claiming_around_a_paused_queue_get_disjoint_jobs(selector):
    enqueue_many(tasks.noop.using(queue_name="paused"), [Call() for _ in range(100)])
    for queue in ("alpha", "alphabet"):
        enqueue_many(tasks.noop.using(queue_name=queue), [Call() for _ in range(100)])
    results: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def run(owner: int) -> None:
        try:
            results[owner] = claim(selector, 15, owner=owner, paused=["paused"])
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(owner,)) for owner in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    assert not any(thread.is_alive() for thread in threads)
    ids = [job_id for claimed in results.values() for job_id in claimed]
    assert len(ids) == len(set(ids)), "a job was handed to two claims"
    assert all(len(claimed) <= 15 for claimed in results.values())
    # A claim around a paused queue locks the head of each queue it reads before it picks
    # its 15, so claims at the same instant may come up short (see "Which index a claim
    # reads" in docs/explanation/claim-protocol.md); what they leave is claimed next.
    rest = claim(selector, 200, owner=9, paused=["paused"])
    assert set(rest).isdisjoint(ids)
    assert len(ids) + len(rest) == (100 if selector == "alpha" else 200)
    queues = set(Job.objects.filter(id__in=ids + rest).values_list("queue_name", flat=True))
    assert "paused" not in queues
    for owner, claimed in results.items():
        assert set(Job.objects.filter(id__in=claimed).values_list("owner", flat=True)) <= {owner}
