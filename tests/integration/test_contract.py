"""The django.tasks contract, against a real database and a real worker."""

import asyncio
import logging
import sys
from dataclasses import replace
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.tasks import TaskResultStatus, default_task_backend, task, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from stalwart import Call, enqueue_many
from stalwart.exceptions import (
    ArgumentsTooLarge,
    InvalidQueueName,
    InvalidTaskArguments,
    NotAStalwartBackend,
)
from stalwart.models import Job
from tests.helpers import Child, drain, wait_for, worker_thread
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def test_backend_declares_every_capability():
    # Each is honoured as well: the tests below defer, prioritise, read results and run
    # async tasks.
    backend = default_task_backend
    assert backend.supports_defer is True
    assert backend.supports_priority is True
    assert backend.supports_get_result is True
    assert backend.supports_async_task is True


# -- validation ---------------------------------------------------------------------------


def test_enqueue_validates_the_task_itself():
    # using() validates too, but a task can be changed behind Django's back; enqueue re-checks.
    bad = tasks.add.using(priority=1)
    object.__setattr__(bad, "priority", 1000)
    with pytest.raises(InvalidTask, match="priority must be a whole number"):
        bad.enqueue(1, 2)
    assert not Job.objects.exists()


def test_priority_out_of_range_is_refused():
    with pytest.raises(InvalidTask, match="priority"):
        tasks.add.using(priority=101)


def test_naive_run_after_is_refused():
    with pytest.raises(InvalidTask, match="aware datetime"):
        tasks.add.using(run_after=timezone.now().replace(tzinfo=None))


def test_queue_names_are_validated():
    with pytest.raises(InvalidQueueName, match="only ASCII letters"):
        tasks.add.using(queue_name="no spaces")
    with pytest.raises(InvalidQueueName, match="limit is 64"):
        tasks.add.using(queue_name="q" * 65)


def test_functions_that_are_not_module_level_are_refused_saying_why():
    def local():
        return None

    with pytest.raises(InvalidTask, match="Task function must be defined at a module level") as e:
        task(local)
    assert "is defined inside a function, so a worker process could not import it" in str(e.value)


def test_a_queue_that_queues_refuses_names_the_setting_to_change():
    with pytest.raises(InvalidTask, match="Queue 'elsewhere' is not valid for backend") as e:
        tasks.add.using(backend="limited", queue_name="elsewhere")
    assert "TASKS['limited']['QUEUES'] allows 'default', 'other'" in str(e.value)
    assert "add 'elsewhere' to it, or set it to [] to allow any queue name" in str(e.value)


def test_bad_arguments_name_the_value_and_store_nothing():
    with pytest.raises(
        InvalidTaskArguments, match=r"Unsupported type for kwargs\['when'\]: datetime"
    ):
        tasks.echo.enqueue(when=timezone.now())
    with pytest.raises(InvalidTaskArguments, match=r"args\[0\] is nan"):
        tasks.echo.enqueue(float("nan"))
    with pytest.raises(InvalidTaskArguments, match=r"kwargs\['ids'\] has the key 1"):
        tasks.echo.enqueue(ids={1: "one"})
    with pytest.raises(InvalidTaskArguments, match=r"args\[0\] is a bytearray, which would be"):
        tasks.echo.enqueue(bytearray(b"ab"))
    assert not Job.objects.exists()


def test_oversized_arguments_get_a_clear_error_not_a_database_failure():
    with pytest.raises(ArgumentsTooLarge, match="over the limit of 1024 bytes"):
        tasks.echo.using(backend="limited").enqueue("x" * 2000)
    assert not Job.objects.exists()


# -- the argument round trip ---------------------------------------------------------------


def test_arguments_come_back_equal_to_what_enqueue_returned():
    result = tasks.echo.enqueue(1, (2, 3), "é", nested={"a": [True, None, 1.25]})
    stored = default_task_backend.get_result(result.id)
    assert stored.args == result.args == [1, [2, 3], "é"]
    assert stored.kwargs == result.kwargs == {"nested": {"a": [True, None, 1.25]}}
    drain()
    result.refresh()
    assert result.return_value == {
        "args": [1, [2, 3], "é"],
        "kwargs": {"nested": {"a": [True, None, 1.25]}},
    }


# -- statuses, results, errors -------------------------------------------------------------


def test_a_successful_job_reports_everything():
    before = timezone.now()
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at >= before
    assert result.started_at is None
    worker = drain()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.errors == []
    assert result.worker_ids == [worker.name]
    assert result.attempts == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    assert result.is_finished


def test_a_failing_job_records_its_error_and_traceback():
    result = tasks.fail.enqueue("it broke")
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 1
    error = result.errors[0]
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "it broke" in error.traceback
    assert "tests/testapp/tasks.py" in error.traceback
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


@pytest.mark.parametrize(
    ("failing", "class_path"),
    [(tasks.exit_process, "builtins.SystemExit"), (tasks.interrupt, "builtins.KeyboardInterrupt")],
)
def test_base_exceptions_fail_the_job_and_the_worker_goes_on(failing, class_path):
    bad = failing.enqueue()
    good = tasks.add.enqueue(1, 1)
    drain(threads=1)
    bad.refresh()
    good.refresh()
    assert bad.status == TaskResultStatus.FAILED
    assert bad.errors[0].exception_class_path == class_path
    assert good.status == TaskResultStatus.SUCCESSFUL


def test_a_return_value_json_cannot_hold_fails_the_job_with_a_type_error_and_its_path():
    # As with Django's own backends: a TypeError that says "Unsupported type".
    result = tasks.returns_unserializable.enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TypeError
    assert "Unsupported type for return value['when']: object" in result.errors[0].traceback


def test_a_return_value_json_accepts_is_stored_as_json_writes_it_not_failed_nor_retried():
    finished = []

    def receive(sender, task_result, **kwargs):
        finished.append(task_result.return_value)

    task_finished.connect(receive)
    try:
        result = tasks.returns_keys_json_writes.enqueue()
        drain(threads=1)
    finally:
        task_finished.disconnect(receive)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    expected = {
        "1": "one",
        "2.5": "two and a half",
        "false": "no",
        "null": "none",
        "nested": {"3": [4]},
    }
    assert result.return_value == expected
    assert finished == [expected]  # what receivers see is what get_result() will return
    assert result.attempts == 1
    assert Execution.objects.filter(job_id=result.id).count() == 1  # its side effects once


# -- what Django's own tests/tasks suite expects of any backend ------------------------------


def test_arguments_json_cannot_hold_raise_a_type_error_as_django_documents():
    with pytest.raises(TypeError, match="Unsupported type for args\\[0\\]: datetime"):
        tasks.echo.enqueue(timezone.now())

    async def enqueue_async():
        try:
            await tasks.echo.aenqueue(timezone.now())
        finally:
            await sync_to_async(connections.close_all, thread_sensitive=True)()

    with pytest.raises(TypeError, match="Unsupported type"):
        asyncio.run(enqueue_async())
    assert not Job.objects.exists()


def test_task_finished_for_a_failed_job_is_sent_while_its_exception_is_handled(caplog):
    seen = []

    def receive(sender, task_result, **kwargs):
        seen.append(sys.exc_info()[1])

    task_finished.connect(receive)
    caplog.set_level(logging.ERROR, logger="django.tasks")
    try:
        result = tasks.fail.enqueue("it broke")
        drain()
    finally:
        task_finished.disconnect(receive)
    assert len(seen) == 1
    assert isinstance(seen[0], ValueError)
    assert str(seen[0]) == "it broke"
    # Django's own receiver logs the failure with its traceback.
    [record] = [r for r in caplog.records if r.name == "django.tasks" and result.id in r.message]
    assert record.levelno == logging.ERROR
    assert "state=FAILED" in record.message
    assert record.exc_info is not None
    assert record.exc_info[1] is seen[0]
    assert "ValueError: it broke" in caplog.text


# -- calls that cannot work fail at enqueue, not in a worker ---------------------------------


def test_a_call_that_does_not_fit_the_signature_fails_at_enqueue():
    with pytest.raises(TypeError, match="missing a required argument: 'b'") as caught:
        tasks.add.enqueue(1)
    assert str(caught.value) == (
        "tests.testapp.tasks.add(a: int, b: int) cannot be called with these arguments: "
        "missing a required argument: 'b'."
    )
    with pytest.raises(TypeError, match="unexpected keyword argument 'c'"):
        tasks.add.enqueue(1, 2, c=3)
    with pytest.raises(TypeError, match="too many positional arguments"):
        tasks.add.enqueue(1, 2, 3)
    # The context is the worker's to pass, not the caller's.
    with pytest.raises(TypeError, match=r"whoami\(\) cannot be called"):
        tasks.whoami.enqueue(1)
    with pytest.raises(TypeError, match="missing a required argument: 'b'") as caught:
        enqueue_many(tasks.add, [Call(1, 2), Call(3)])
    assert "Raised for call 2 (counting from 1)" in str(caught.value.__notes__)
    assert not Job.objects.exists()
    tasks.whoami.enqueue()
    tasks.echo.enqueue(1, 2, anything="goes")
    assert Job.objects.count() == 2


def test_a_task_defined_in_main_is_refused_at_enqueue_saying_why():
    def probe() -> None:
        return None

    probe.__module__ = "__main__"
    probe.__qualname__ = "probe"
    declared = task(probe)
    with pytest.raises(InvalidTask, match="defined in __main__") as caught:
        declared.enqueue()
    assert "a worker process could not import it" in str(caught.value)
    assert not Job.objects.exists()


def test_a_task_that_is_not_at_its_path_is_refused_at_enqueue():
    def probe() -> None:
        return None

    probe.__module__ = "tests.testapp.tasks"
    probe.__qualname__ = "not_there"
    with pytest.raises(InvalidTask, match="has no task named 'not_there'"):
        task(probe).enqueue()
    assert not Job.objects.exists()


def test_a_task_defined_in_the_shell_is_refused_at_enqueue_saying_why():
    code = (
        "from django.tasks import task\n"
        "@task\n"
        "def hello():\n"
        "    return 1\n"
        "try:\n"
        "    hello.enqueue()\n"
        "except Exception as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    connections.close_all()
    with Child("shell", "--no-imports", "-c", code) as shell:
        assert shell.wait(timeout=60) == 0, shell.output
    assert "TaskNotImportable" in shell.output
    assert "defined interactively" in shell.output, shell.output
    assert not Job.objects.exists()


def test_a_stored_path_that_is_not_a_task_fails_that_job_only():
    not_a_task = tasks.noop.enqueue()
    Job.objects.filter(pk=not_a_task.id).update(task_path="os.getcwd")
    missing = tasks.noop.enqueue()
    Job.objects.filter(pk=missing.id).update(task_path="tests.testapp.tasks.gone")
    fine = tasks.add.enqueue(2, 2)
    # No grace for a task another release might have: these no release has.
    drain(threads=1, config=replace(task_backends["default"].config, task_not_found_grace=0))
    rows = {str(job.pk): job for job in Job.objects.all()}
    assert rows[not_a_task.id].status == "failed"
    assert (
        "not a django.tasks task; refusing to run it" in rows[not_a_task.id].errors[0]["traceback"]
    )
    assert rows[missing.id].status == "failed"
    assert rows[missing.id].errors[0]["exception_class_path"] == "stalwart.exceptions.TaskNotFound"
    assert rows[fine.id].status == "successful"


def test_a_task_this_worker_lacks_waits_for_another_worker_within_the_grace():
    missing = tasks.noop.enqueue()
    Job.objects.filter(pk=missing.id).update(task_path="tests.testapp.tasks.added_later")
    with worker_thread(threads=1):
        wait_for(
            lambda: Job.objects.get(pk=missing.id).status == "scheduled",
            message="the job to be put back for another worker",
        )
    row = Job.objects.get(pk=missing.id)
    # Neither failed nor charged nor counted as an interruption: its body never began.
    assert (row.errors, row.interruptions, row.owner) == ([], [], None)
    assert row.available_at > row.last_attempted_at


def test_task_context_reports_the_attempt_and_id():
    result = tasks.whoami.enqueue()
    worker = drain()
    result.refresh()
    assert result.return_value == {"id": result.id, "attempt": 1, "worker_ids": [worker.name]}


def test_get_result_of_an_unknown_id_raises_does_not_exist():
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("0192f7e0-0000-7000-8000-000000000000")
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("not-a-uuid")


def test_get_result_on_the_task_checks_the_task():
    result = tasks.add.enqueue(1, 2)
    assert tasks.add.get_result(result.id).id == result.id
    with pytest.raises(Exception, match="Task does not match"):
        tasks.noop.get_result(result.id)


# -- signals -------------------------------------------------------------------------------


class SignalLog:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, TaskResultStatus]] = []

    def receiver(self, name):
        def receive(sender, task_result, **kwargs):
            self.seen.append((name, task_result.id, task_result.status))

        return receive


def test_enqueued_started_and_finished_signals_are_sent():
    log = SignalLog()
    receivers = {
        signal: log.receiver(name)
        for signal, name in [
            (task_enqueued, "enqueued"),
            (task_started, "started"),
            (task_finished, "finished"),
        ]
    }
    for signal, receiver in receivers.items():
        signal.connect(receiver)
    try:
        ok = tasks.add.enqueue(1, 2)
        bad = tasks.fail.enqueue()
        drain(threads=1)
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)
    assert ("enqueued", ok.id, TaskResultStatus.READY) in log.seen
    assert ("started", ok.id, TaskResultStatus.RUNNING) in log.seen
    assert ("finished", ok.id, TaskResultStatus.SUCCESSFUL) in log.seen
    assert ("finished", bad.id, TaskResultStatus.FAILED) in log.seen


def test_enqueued_signal_waits_for_commit_and_is_not_sent_on_rollback():
    log = SignalLog()
    receiver = log.receiver("enqueued")
    task_enqueued.connect(receiver)
    try:
        with transaction.atomic():
            committed = tasks.add.enqueue(1, 1)
            assert log.seen == []
        assert [entry[1] for entry in log.seen] == [committed.id]
        rolled_back(lambda: tasks.add.enqueue(2, 2))
        assert len(log.seen) == 1
    finally:
        task_enqueued.disconnect(receiver)


# -- transactions --------------------------------------------------------------------------


def rolled_back(work):
    """Run ``work()`` in a transaction that is then rolled back; return what it returned."""
    returned = []

    class RollBack(Exception):
        pass

    try:
        with transaction.atomic():
            returned.append(work())
            raise RollBack
    except RollBack:
        pass
    return returned[0]


def test_enqueue_rolled_back_never_existed():
    result = rolled_back(lambda: tasks.add.enqueue(1, 2))
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result.id)
    drain()
    assert not Job.objects.exists()


def test_enqueue_committed_is_claimable():
    with transaction.atomic():
        result = tasks.add.enqueue(1, 2)
    drain()
    result.refresh()
    assert result.return_value == 3


# -- async API -----------------------------------------------------------------------------


def test_async_enqueue_get_result_and_async_tasks():
    async def scenario():
        result = await tasks.async_add.aenqueue(20, 22)
        fetched = await tasks.async_add.aget_result(result.id)
        # The async API ran in asgiref's thread; close the connection it opened there.
        await sync_to_async(connections.close_all, thread_sensitive=True)()
        return result, fetched

    result, fetched = asyncio.run(scenario())
    assert fetched.id == result.id
    assert fetched.status == TaskResultStatus.READY
    drain()

    async def refresh():
        await result.arefresh()
        await sync_to_async(connections.close_all, thread_sensitive=True)()

    asyncio.run(refresh())
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42


# -- priorities and run_after --------------------------------------------------------------


def test_higher_priority_runs_first_then_older_first():
    for label, priority in [("p0-a", 0), ("p-50", -50), ("p90", 90), ("p0-b", 0), ("p10", 10)]:
        tasks.record.using(priority=priority).enqueue(label=label)
    drain(threads=1)
    order = list(Execution.objects.order_by("id").values_list("label", flat=True))
    assert order == ["p90", "p10", "p0-a", "p0-b", "p-50"]


def test_run_after_is_respected():
    run_after = timezone.now() + timedelta(seconds=0.6)
    later = tasks.record.using(run_after=run_after).enqueue(label="later")
    now = tasks.record.enqueue(label="now")
    assert Job.objects.get(pk=later.id).status == "scheduled"
    assert later.status == TaskResultStatus.READY  # Django has no "scheduled" status
    drain(threads=1)
    later.refresh()
    now.refresh()
    assert later.status == now.status == TaskResultStatus.SUCCESSFUL
    assert later.started_at >= run_after
    execution = Execution.objects.get(label="later")
    assert execution.started_at >= run_after


def test_run_after_in_the_past_is_ready_at_once():
    result = tasks.add.using(run_after=timezone.now() - timedelta(hours=1)).enqueue(1, 1)
    assert Job.objects.get(pk=result.id).status == "ready"


# -- bulk ----------------------------------------------------------------------------------


def test_enqueue_many_writes_one_statement_and_returns_results():
    from django.db import connection

    with CaptureQueriesContext(connection) as queries:
        results = enqueue_many(tasks.add, [Call(i, i) for i in range(200)])
    inserts = [q for q in queries.captured_queries if "INSERT" in q["sql"]]
    assert len(inserts) == 1
    assert len(results) == 200
    assert len({result.id for result in results}) == 200
    drain(threads=4)
    assert sorted(Job.objects.values_list("return_value", flat=True)) == sorted(
        2 * i for i in range(200)
    )


def test_enqueue_many_stays_under_sqlites_default_parameter_limit():
    """Python builds of SQLite differ in how many parameters a statement may take; many
    keep SQLite's default, 32,766. Bulk inserts must fit in that."""
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("a limit of SQLite's")
    import sqlite3

    connection.ensure_connection()
    raw = connection.connection
    previous = raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 32_766)
    try:
        results = enqueue_many(tasks.noop, [Call() for _ in range(5000)])
    finally:
        raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, previous)
    assert len(results) == 5000
    assert Job.objects.count() == 5000


def test_enqueue_many_accepts_plain_pairs_and_validates_everything_first():
    with pytest.raises(InvalidTaskArguments, match=r"kwargs\['x'\]") as caught:
        enqueue_many(tasks.echo, [((1,), {}), ((2,), {"x": object()})])
    assert "Raised for call 2 (counting from 1)" in str(caught.value.__notes__)
    assert not Job.objects.exists()


def test_enqueue_many_inside_a_rolled_back_transaction_leaves_nothing():
    rolled_back(lambda: enqueue_many(tasks.noop, [Call() for _ in range(10)]))
    assert not Job.objects.exists()


def test_enqueue_many_refuses_other_backends():
    with pytest.raises(NotAStalwartBackend, match="ImmediateBackend"):
        enqueue_many(tasks.noop.using(backend="immediate"), [Call()])


def test_backend_instances_share_no_state_between_aliases():
    assert task_backends["default"].config.max_arguments_size != (
        task_backends["limited"].config.max_arguments_size
    )


# -- job boundaries ------------------------------------------------------------------------


def test_a_job_that_leaves_a_transaction_open_does_not_poison_the_next():
    bad = tasks.leave_transaction_open.enqueue()
    good = tasks.record.enqueue(label="after")
    drain(threads=1)
    bad.refresh()
    good.refresh()
    # Its writes were lost with the transaction, so it did not succeed.
    assert bad.status == TaskResultStatus.FAILED
    assert bad.errors[0].exception_class_path == "stalwart.exceptions.TransactionLeftOpen"
    assert "transaction still open on DATABASES['default']" in bad.errors[0].traceback
    assert good.status == TaskResultStatus.SUCCESSFUL
    # The abandoned transaction was rolled back, not committed by the next job.
    assert not Execution.objects.filter(job_id="abandoned").exists()
    assert Execution.objects.filter(label="after").count() == 1


def test_a_job_that_kills_its_connection_does_not_poison_the_next():
    first = tasks.break_connection.enqueue()
    second = tasks.record.enqueue(label="after")
    drain(threads=1)
    second.refresh()
    first.refresh()
    assert first.is_finished
    assert second.status == TaskResultStatus.SUCCESSFUL
