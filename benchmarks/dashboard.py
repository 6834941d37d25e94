"""The dashboard's benchmark: every page's render time on a table of a million jobs.

    python benchmarks/dashboard.py [--jobs 1000000] [--rounds 5] [--keep]

PostgreSQL only (database ``stalwart_bench_dashboard``, created and migrated here). It fills
the job table the way a busy site's looks after a day: mostly successful jobs, tens of
thousands failed with their tracebacks, backlogs of ready jobs in one queue, scheduled,
blocked, running and cancelled jobs. Then it renders each page through Django's test
client (the whole view: queries, template, response), and prints the median and the worst
of ``--rounds`` renders after one warm-up. Figures are printed, never asserted.

``--keep`` reuses the jobs of an earlier run if the table already holds them.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.dashboard_settings"

QUEUES = ("default", "mail", "reports")
TASKS = [f"benchmarks.tasks.task_{n}" for n in range(8)]
RARE_TASK = "benchmarks.tasks.rarely_run"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    + '  File "/srv/app/shop/tasks.py", line 42, in sync_orders\n    client.push(order)\n' * 12
    + "ConnectionError: the partner's API did not answer"
)


def fill(total: int) -> None:
    """Insert the jobs with a few INSERT … SELECT statements (generate_series)."""
    from django.db import connection

    from stalwart.models import Process

    shares = {  # state: share of the total
        "successful": 0.895,
        "failed": 0.05,
        "cancelled": 0.005,
        "ready": 0.04,
        "scheduled": 0.005,
        "blocked": 0.005,
    }
    Process.objects.all().delete()
    owner = Process.objects.create(
        kind="worker",
        name="worker-bench-1",
        pid=1,
        hostname="bench",
        created_at=_now(),
        last_heartbeat_at=_now(),
        metadata={"queues": "*", "threads": 50, "busy": 50},
    )
    tasks = "ARRAY[" + ", ".join(f"'{task}'" for task in TASKS) + "]"
    queues = "ARRAY[" + ", ".join(f"'{queue}'" for queue in QUEUES) + "]"
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE stalwart_job, stalwart_concurrency_key")
        for state, share in shares.items():
            count = int(total * share)
            finished = state in ("successful", "failed", "cancelled")
            errors = (
                "jsonb_build_array(jsonb_build_object('exception_class_path', "
                "'builtins.ConnectionError', 'traceback', %s::text))"
                if state == "failed"
                else "'[]'::jsonb"
            )
            # The ready backlog is in one queue ("reports"); the rest spread evenly.
            queue = "'reports'" if state == "ready" else f"({queues})[1 + mod(n, 3)]"
            task = (
                f"CASE WHEN mod(n, 10000) = 0 THEN '{RARE_TASK}' ELSE ({tasks})[1 + mod(n, 8)] END"
            )
            cursor.execute(
                f"""
                INSERT INTO stalwart_job (
                    id, task_path, backend, queue_name, priority, status, args, kwargs,
                    available_at, enqueued_at, started_at, last_attempted_at, finished_at,
                    attempt, max_attempts, worker_ids, errors, concurrency_key,
                    concurrency_limit, unique_while_running, isolated)
                SELECT gen_random_uuid(), {task}, 'default', {queue}, (mod(n, 3)) - 1, %s,
                       jsonb_build_array(n, 'customer-' || n), '{{}}'::jsonb,
                       CASE WHEN %s = 'scheduled' THEN now() + (mod(n, 3600)) * interval '1 s'
                            ELSE now() - (mod(n, 86400)) * interval '1 s' END,
                       now() - (mod(n, 86400)) * interval '1 s' - interval '1 s',
                       {"now() - (mod(n, 86400)) * interval '1 s'" if finished else "NULL"},
                       {"now() - (mod(n, 86400)) * interval '1 s'" if finished else "NULL"},
                       {"now() - (mod(n, 86400)) * interval '1 s'" if finished else "NULL"},
                       {1 if finished else 0}, 5,
                       {"'[\"worker-bench-1\"]'::jsonb" if finished else "'[]'::jsonb"},
                       {errors},
                       {"'account-' || (mod(n, 50))" if state == "blocked" else "NULL"},
                       {"1" if state == "blocked" else "NULL"}, false, false
                FROM generate_series(1, %s) AS n
                """,
                [state, state, *([TRACEBACK] if state == "failed" else []), count],
            )
        # Running: one worker's fifty threads.
        cursor.execute(
            f"""
            INSERT INTO stalwart_job (
                id, task_path, backend, queue_name, priority, status, args, kwargs,
                available_at, enqueued_at, started_at, last_attempted_at, attempt,
                max_attempts, worker_ids, errors, owner, unique_while_running, isolated)
            SELECT gen_random_uuid(), ({tasks})[1 + mod(n, 8)], 'default',
                   ({queues})[1 + mod(n, 3)], 0, 'running', '[]', '{{}}',
                   now(), now(), now(), now(), 1, 5,
                   '["worker-bench-1"]', '[]', %s, false, false
            FROM generate_series(1, 50) AS n
            """,
            [owner.id],
        )
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE stalwart_job")


def _now():
    from django.utils import timezone

    return timezone.now()


def pages() -> list[tuple[str, str, dict | None]]:
    """(name, path, POST data or None) for every page worth timing."""
    from stalwart.models import Job

    base = "/admin/stalwart/dashboard/default"
    failed = Job.objects.filter(status="failed").only("id").first()
    from datetime import timedelta

    since = (_now() - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    return [
        ("overview", f"{base}/", None),
        ("ready", f"{base}/jobs/ready/", None),
        ("ready, one queue", f"{base}/jobs/ready/?queue=reports", None),
        ("ready, rare task", f"{base}/jobs/ready/?task={RARE_TASK}", None),
        ("scheduled", f"{base}/jobs/scheduled/", None),
        ("running", f"{base}/jobs/running/", None),
        ("blocked", f"{base}/jobs/blocked/", None),
        ("failed", f"{base}/jobs/failed/", None),
        ("failed, one queue", f"{base}/jobs/failed/?queue=mail", None),
        ("failed, rare task", f"{base}/jobs/failed/?task={RARE_TASK}", None),
        ("successful", f"{base}/jobs/successful/", None),
        ("successful, one task", f"{base}/jobs/successful/?task={TASKS[3]}", None),
        ("successful, rare task", f"{base}/jobs/successful/?task={RARE_TASK}", None),
        ("successful, one queue", f"{base}/jobs/successful/?queue=mail", None),
        ("successful, priority 1", f"{base}/jobs/successful/?priority=1", None),
        ("successful, last hour", f"{base}/jobs/successful/?since={since}", None),
        ("cancelled", f"{base}/jobs/cancelled/", None),
        ("search by id", f"{base}/jobs/failed/?id={failed.id}", None),
        ("job (failed, traceback)", f"{base}/job/{failed.id}/", None),
        ("processes", f"{base}/processes/", None),
        ("recurring tasks", f"{base}/recurring/", None),
        (
            "confirm: retry all failed in a queue",
            f"{base}/jobs/failed/bulk/",
            {"action": "retry", "scope": "all", "queue": "mail"},
        ),
        ("metrics endpoint", "/metrics", None),
    ]


def second_pages(client) -> list[tuple[str, str, None]]:
    """Page 2 of the biggest lists, reached by their "next" cursor."""
    import re

    found = []
    for state in ("successful", "failed", "ready"):
        path = f"/admin/stalwart/dashboard/default/jobs/{state}/"
        html = client.get(path).content.decode()
        cursor = re.search(r'after=([^"&]+)" rel="next"', html)
        if cursor:
            found.append((f"{state}, page 2", f"{path}?after={cursor[1]}", None))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="Reuse jobs already there.")
    options = parser.parse_args()

    import django

    django.setup()
    from benchmarks.bench import filled_table

    filled_table(options.jobs, keep=options.keep, fill=fill)
    from django.contrib.auth.models import User
    from django.test import Client

    user = User.objects.filter(username="bench").first() or User.objects.create_superuser(
        "bench", password=None
    )
    client = Client()
    client.force_login(user)
    token = client.get("/admin/stalwart/dashboard/default/").cookies["csrftoken"].value
    client = Client(enforce_csrf_checks=False)
    client.force_login(user)
    rows = []
    for name, path, data in pages() + second_pages(client):
        times = []
        for round_number in range(options.rounds + 1):
            begun = time.perf_counter()
            if data is None:
                response = client.get(path)
            else:
                response = client.post(path, {**data, "csrfmiddlewaretoken": token})
            elapsed = (time.perf_counter() - begun) * 1000
            if response.status_code not in (200, 302):
                raise SystemExit(f"{name}: {path} answered {response.status_code}")
            if round_number:  # the first is a warm-up
                times.append(elapsed)
        rows.append((name, statistics.median(times), max(times)))
    width = max(len(name) for name, _, _ in rows)
    print(f"{'page':{width}}  median ms  worst ms")
    for name, median, worst in rows:
        flag = "" if worst < 300 else "  (over 300 ms)"
        print(f"{name:{width}}  {median:9.1f}  {worst:8.1f}{flag}")


if __name__ == "__main__":
    main()
