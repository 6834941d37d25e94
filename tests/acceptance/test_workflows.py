"""Dependencies and batches under ``queue supervise``: real processes, real forks, real
SIGKILLs.

Two supervisors share the database, each with a dispatcher that releases dependants. A
fan-out and fan-in (40 parents, one child after all of them) and a chain of five links run
while one dispatcher is killed: every dependant runs once, after its parents, and nothing is
left pending. A dispatcher killed inside the transaction that enqueues a batch's callback
leaves it to another: the callback runs once.
"""

import itertools
import os
import signal

import pytest
from django.tasks import TaskResultStatus

import stalwart
from stalwart import Call, chain, enqueue_after, enqueue_many
from stalwart.models import BatchJob, Job, Process
from tests.acceptance.supervision import (
    assert_nothing_left_behind,
    executions_per_job,
    start_supervisor,
    stop,
)
from tests.helpers import wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_fan_in_and_a_chain_finish_once_each_with_a_dispatcher_killed(reaped):
    first = start_supervisor("--processes", "2", "--threads", "3", children=4)
    reaped.append(first)
    second = start_supervisor("--processes", "1", "--threads", "3", children=3)
    reaped.append(second)

    parents = enqueue_many(tasks.record, [Call(label="part", sleep=0.05) for _ in range(40)])
    gathered = enqueue_after(parents, tasks.parent_states)
    links = chain(
        (tasks.add, Call(1, 1)),
        *[(tasks.plus_parents, Call(n=1)) for _ in range(4)],
    )
    first_row = Process.objects.get(pid=first.pid, kind="supervisor")
    dispatcher = Process.objects.get(supervisor=first_row.id, kind="dispatcher")
    os.kill(dispatcher.pid, signal.SIGKILL)

    ids = [gathered.id, *(link.id for link in links)]
    wait_for(
        lambda: Job.objects.filter(pk__in=ids, status="successful").count() == len(ids),
        timeout=60,
        message="the fan-in and the chain to finish",
    )
    gathered.refresh()
    assert gathered.status == TaskResultStatus.SUCCESSFUL
    assert gathered.return_value == ["SUCCESSFUL"] * 40
    for link in links:
        link.refresh()
    assert [link.return_value for link in links] == [2, 3, 4, 5, 6]

    rows = {str(row.id): row for row in Job.objects.all()}
    last_parent = max(rows[str(parent.id)].finished_at for parent in parents)
    assert rows[gathered.id].started_at >= last_parent
    for before, after in itertools.pairwise(links):
        assert rows[after.id].started_at >= rows[before.id].finished_at
    assert {rows[job_id].attempt for job_id in ids} == {1}
    assert set(executions_per_job().values()) == {1}
    assert not Job.objects.filter(status="pending").exists()

    assert stop(first) == 0, first.output
    assert stop(second) == 0, second.output
    assert_nothing_left_behind()


def test_a_dispatcher_killed_while_it_finishes_a_batch_leaves_its_callback_to_another(
    reaped, tmp_path
):
    flag = tmp_path / "die-finishing-batch"
    flag.write_text("armed")
    env = {"STALWART_FAULT_DIE_FINISHING_BATCH": str(flag)}
    first = start_supervisor("--processes", "1", "--threads", "4", children=3, **env)
    reaped.append(first)
    second = start_supervisor("--processes", "1", "--threads", "4", children=3, **env)
    reaped.append(second)

    with stalwart.batch(on_finish=(tasks.record, Call(label="callback"))) as batch:
        batch.enqueue_many(tasks.record, [Call(label="member") for _ in range(20)])

    wait_for(lambda: not flag.exists(), timeout=60, message="a dispatcher to die finishing")
    wait_for(
        lambda: Execution.objects.filter(label="callback").exists(),
        timeout=60,
        message="the callback to run, enqueued by the other dispatcher or a replacement",
    )
    assert BatchJob.objects.filter(batch=batch.id).exclude(role="member").count() == 1
    assert Execution.objects.filter(label="callback").count() == 1
    assert Execution.objects.filter(label="member").count() == 20
    assert batch.finished
    killed = "was killed by SIGKILL"
    assert killed in first.output + second.output

    assert stop(first) == 0, first.output
    assert stop(second) == 0, second.output
    assert_nothing_left_behind()
