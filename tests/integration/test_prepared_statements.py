"""The worker's finish-and-claim on PostgreSQL: prepared in the queue's own sessions (so it is
planned once, not at every turn), never behind a declared pooler, and run again unprepared
when its server session lost it."""

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import OperationalError, connection, connections, transaction

from stalwart.db import Outcome
from stalwart.db.deadline import cut
from stalwart.jobs import JobStore
from stalwart.models import Job
from stalwart.processes.outcomes import ClaimRequest, OutcomeWriter
from stalwart.processes.runner import Finished
from stalwart.queues import QueueSelector
from tests.helpers import PGBOUNCER, register_processes
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)
# Through PgBouncer, each transaction may run on another server session.
ONE_SESSION = pytest.mark.skipif(
    PGBOUNCER, reason="looks at the prepared statements of one server session"
)

EVERYTHING = QueueSelector.parse("*")
OWNER = 31


@pytest.fixture
def postgresql(vendor):
    if vendor != "postgresql":
        pytest.skip("psycopg's server-side prepared statements: PostgreSQL's")


def in_bookkeeping_thread(work: Callable[[], Any], *, pooled: bool = False) -> Any:
    """``work()``'s result, run on a thread whose sessions are the queue's own."""
    from stalwart.db.session import bookkeeping

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            bookkeeping(
                "default",
                application_name="stalwart:worker:31",
                statement_timeout=5,
                lock_timeout=1,
                pooled=pooled,
            )
            outcome["value"] = work()
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = error
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def turns(count: int) -> Callable[[], dict]:
    """A worker's turns, as its loop takes them: each writes the outcomes of the jobs the
    previous one claimed, and claims as many. Returns what the last turn wrote and claimed,
    and the session's prepared statements."""

    def work() -> dict:
        store = JobStore("default")
        claimed = store.claim(owner=OWNER, worker_name="w31", selector=EVERYTHING, limit=2)
        written: dict = {}
        for _ in range(count):
            written, claimed = store.finish_and_claim(
                owner=OWNER,
                outcomes=[
                    Outcome(id=job.id, attempt=job.attempt, status="successful") for job in claimed
                ],
                worker_name="w31",
                selector=EVERYTHING,
                limit=2,
            )
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "SELECT statement, generic_plans FROM pg_prepared_statements "
                "WHERE statement LIKE '%%finished AS%%'"
            )
            prepared = cursor.fetchall()
        return {"written": written, "claimed": claimed, "prepared": prepared}

    return work


@pytest.fixture
def backlog():
    register_processes(OWNER)
    return [tasks.noop.enqueue() for _ in range(40)]


@ONE_SESSION
def test_the_queues_own_session_prepares_finish_and_claim_and_keeps_a_generic_plan(
    postgresql, backlog
):
    seen = in_bookkeeping_thread(turns(10))
    assert len(seen["written"]) == 2
    assert len(seen["claimed"]) == 2
    # One statement, prepared once; after its first few custom plans, PostgreSQL keeps the
    # generic plan: no planning at each turn.
    [(_, generic_plans)] = seen["prepared"]
    assert generic_plans >= 1
    assert Job.objects.filter(status="successful").count() == 20
    # Nothing of the kind on the application's sessions.
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone() == (0,)


@ONE_SESSION
def test_behind_a_declared_pooler_nothing_is_prepared(postgresql, backlog):
    seen = in_bookkeeping_thread(turns(10), pooled=True)
    assert seen["prepared"] == []
    assert len(seen["written"]) == 2
    assert Job.objects.filter(status="successful").count() == 20


@ONE_SESSION
def test_a_prepared_statement_its_session_lost_is_run_again_unprepared(
    postgresql, backlog, recorded_events
):
    def work() -> dict:
        turns(3)()
        # What a pooler in transaction mode nobody told us about does: the next transaction
        # runs in another server session, which has none of our prepared statements. Here,
        # they are dropped behind psycopg's back.
        raw = connections["default"].connection
        raw.pgconn.exec_(b"DEALLOCATE ALL")
        return turns(3)()

    seen = in_bookkeeping_thread(work)
    # The turn that found its statement gone wrote and claimed all the same, and the
    # connection prepares nothing more.
    assert len(seen["written"]) == 2
    assert len(seen["claimed"]) == 2
    assert seen["prepared"] == []
    assert Job.objects.filter(status="successful").count() == 12
    # (Each series of turns began with a claim, and ends holding what its last turn claimed.)
    assert Job.objects.filter(status="running", owner=OWNER).count() == 4
    lost = [fields for action, fields in recorded_events if action == "prepared_statements_lost"]
    assert len(lost) == 1
    assert "does not exist" in lost[0]["error"]


def admin_session() -> psycopg.Connection:
    """A session of the test's own, beside the worker's."""
    settings = connection.settings_dict
    return psycopg.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=settings["PORT"] or 5432,
        user=settings["USER"],
        dbname=settings["NAME"],
        autocommit=True,
    )


@ONE_SESSION
def test_a_session_ended_under_the_worker_is_replaced_and_prepares_again(
    postgresql, backlog, recorded_events
):
    def work() -> dict:
        turns(3)()
        ended = connections["default"].connection.info.backend_pid
        with admin_session() as other:
            other.execute("SELECT pg_terminate_backend(%s)", [ended])
        seen = turns(3)()
        seen["ended"] = ended
        seen["now"] = connections["default"].connection.info.backend_pid
        return seen

    seen = in_bookkeeping_thread(work)
    assert seen["now"] != seen["ended"]
    assert len(seen["written"]) == 2
    assert len(seen["prepared"]) == 1  # the new session's psycopg knows nothing of the old
    assert Job.objects.filter(status="successful").count() == 12
    actions = [action for action, _ in recorded_events]
    assert "database_retry" in actions
    assert "prepared_statements_lost" not in actions


@ONE_SESSION
def test_a_statement_lost_inside_a_transaction_is_not_run_again_there(
    postgresql, backlog, recorded_events
):
    """Inside an atomic block the error is the caller's (the transaction is spoilt); the
    rollback makes psycopg forget its statements, and the next turn prepares again."""

    def work() -> dict:
        turns(2)()
        connections["default"].connection.pgconn.exec_(b"DEALLOCATE ALL")
        with pytest.raises(Exception, match="does not exist"), transaction.atomic():
            JobStore("default").finish_and_claim(
                owner=OWNER, outcomes=[], worker_name="w31", selector=EVERYTHING, limit=2
            )
        return turns(3)()

    seen = in_bookkeeping_thread(work)
    assert len(seen["written"]) == 2
    assert len(seen["prepared"]) == 1
    assert "prepared_statements_lost" not in [action for action, _ in recorded_events]
    assert Job.objects.filter(status="successful").count() == 10


@ONE_SESSION
@pytest.mark.parametrize(
    "theirs",
    [
        # Another worker's finish-and-claim, for five idle threads.
        lambda ours: ours.replace(b"LIMIT 2", b"LIMIT 5"),
        # Anything else, of other parameters.
        lambda ours: b"SELECT $1::integer",
    ],
    ids=["another-limit", "other-parameters"],
)
def test_a_statement_another_client_prepared_is_never_run_in_place_of_ours(
    postgresql, backlog, theirs
):
    """Behind a pooler in transaction mode nobody told us about, a transaction may run on a
    server session where another client prepared statements: psycopg's first is always
    ``_pg3_0``. Ours are named otherwise, so theirs is never run for ours."""

    def work() -> dict:
        turns(1)()
        raw = connections["default"].connection
        [(query, types)] = list(raw._prepared._names)
        raw.pgconn.exec_(b"DEALLOCATE ALL")
        for number in range(3):
            made = raw.pgconn.prepare(f"_pg3_{number}".encode(), theirs(query), types)
            assert made.status == psycopg.pq.ExecStatus.COMMAND_OK
        return turns(2)()

    seen = in_bookkeeping_thread(work)
    assert len(seen["written"]) == 2
    assert len(seen["claimed"]) == 2  # as asked, not five
    # (Each series of turns began with a claim, and ends holding what its last turn claimed.)
    assert Job.objects.filter(status="running", owner=OWNER).count() == 4


@ONE_SESSION
def test_outcomes_of_a_prepared_turn_whose_answer_was_lost_are_reported_once(
    postgresql, backlog, recorded_events
):
    """The link goes down after the prepared finish-and-claim committed: the retry, on a new
    session, matches none of the outcomes, and the rows tell they were written."""
    results = {result.id: result for result in backlog}
    lost: list = []

    def lose_the_answer(execute, sql, params, many, context):
        answer = execute(sql, params, many, context)  # committed (autocommit)...
        if "finished AS (" in sql and not lost:
            lost.append(connections["default"].connection.info.backend_pid)
            cut(connections["default"])  # ...and the link goes down before the answer arrives
            message = "server closed the connection unexpectedly"
            raise OperationalError(message) from psycopg.OperationalError(message)
        return answer

    def work() -> dict:
        store = JobStore("default")
        jobs = store.claim(owner=OWNER, worker_name="w31", selector=EVERYTHING, limit=2)
        items = []
        for job in jobs:
            item = Finished(
                job=job,
                outcome=Outcome(id=job.id, attempt=job.attempt, status="successful"),
                result=None,
                duration=0.0,
            )
            object.__setattr__(item, "result", results[str(job.id)])
            items.append(item)
        held: list = []
        request = ClaimRequest(limit=2, worker_name="w31", selector=EVERYTHING, paused=())
        writer = OutcomeWriter(store, process="w31", sender=object)
        with connections["default"].execute_wrapper(lose_the_answer):
            settled = writer.flush(OWNER, items, claim=request, hold=held.extend)
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid(), count(*) FROM pg_prepared_statements")
            now, prepared = cursor.fetchone()
        return {"items": items, "settled": settled, "held": held, "now": now, "prepared": prepared}

    seen = in_bookkeeping_thread(work)
    assert lost, "the fault was not injected"
    assert seen["now"] != lost[0]
    assert seen["prepared"] == 1  # prepared again on the new session
    assert seen["settled"] == seen["items"]
    assert len(seen["held"]) == 2
    finished = [str(item.job.id) for item in seen["items"]]
    assert sorted(str(job.id) for job in Job.objects.filter(status="successful")) == sorted(
        finished
    )
    actions = [action for action, _ in recorded_events]
    assert "job_result_discarded" not in actions
    assert actions.count("job_succeeded") == 2


AWKWARD = [
    'a "quoted" word',
    'back\\slash \\\\ and \\"',
    "{braces, commas}",
    "NULL",
    "",
    "line\nbreak\ttab",
    "ünïcödé ✓",
]


@ONE_SESSION
@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "client-bound"])
def test_outcome_texts_reach_the_rows_unchanged_whatever_they_hold(postgresql, backlog, prepared):
    """The outcome arrays go to the server as array literals quoted here: every character
    of a return value or an error list must come out as it went in."""
    import json

    def work() -> list:
        store = JobStore("default")
        claimed = store.claim(
            owner=OWNER, worker_name="w31", selector=EVERYTHING, limit=len(AWKWARD)
        )
        outcomes = []
        for job, text in zip(claimed, AWKWARD, strict=True):
            errors = json.dumps([{"exception_class_path": text, "traceback": text}])
            outcomes.append(
                Outcome(id=job.id, attempt=job.attempt, status="failed", errors=errors)
                if job is claimed[0]
                else Outcome(
                    id=job.id,
                    attempt=job.attempt,
                    status="successful",
                    return_value=json.dumps(text),
                )
            )
        if prepared:
            written, _ = store.finish_and_claim(
                owner=OWNER, outcomes=outcomes, worker_name="w31", selector=EVERYTHING, limit=1
            )
        else:
            written = store.finish(owner=OWNER, outcomes=outcomes)
        assert len(written) == len(AWKWARD)
        return [(job.id, text) for job, text in zip(claimed, AWKWARD, strict=True)]

    pairs = in_bookkeeping_thread(work) if prepared else work()
    first_id, first_text = pairs[0]
    failed = Job.objects.get(pk=first_id)
    assert failed.errors == [{"exception_class_path": first_text, "traceback": first_text}]
    for job_id, text in pairs[1:]:
        assert Job.objects.get(pk=job_id).return_value == text


@pytest.mark.skipif(not PGBOUNCER, reason="needs PgBouncer (python -m tests.pgbouncer)")
def test_an_undeclared_pooler_that_refuses_the_options_gets_nothing_prepared(
    postgresql, backlog, recorded_events
):
    """PgBouncer, not declared with transaction_pooler: it refuses the timeouts' ``options``
    startup parameter, and the connection made without it prepares nothing either."""

    def work() -> dict:
        seen = turns(10)()
        seen["threshold"] = connections["default"].connection.prepare_threshold
        return seen

    seen = in_bookkeeping_thread(work, pooled=False)
    assert "session_options_refused" in [action for action, _ in recorded_events]
    assert seen["threshold"] is None
    assert len(seen["written"]) == 2
    assert "prepared_statements_lost" not in [action for action, _ in recorded_events]
    assert Job.objects.filter(status="successful").count() == 20
