"""The reference the drain is measured against: a bare worker, the limit of what one can do.

    python -m benchmarks.bare --threads N --body noop|insert

One psycopg connection claims up to N ready jobs of ``stalwart_job`` in one statement
(``FOR UPDATE SKIP LOCKED``), runs the task body on N threads (a thread pool whose Django
connections persist, as a worker's do), and marks the whole batch successful in one
statement. No process row, no fencing, no results, no signals, no events, no timeouts: the
floor a queue's bookkeeping is measured from. It polls every 5 ms when it finds nothing, and
is ended with TERM.
"""

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"

CLAIM = """
    WITH picked AS MATERIALIZED (
        SELECT id FROM stalwart_job WHERE status = 'ready'
        ORDER BY priority DESC, available_at, id
        LIMIT %s FOR UPDATE SKIP LOCKED
    )
    UPDATE stalwart_job AS job
    SET status = 'running', attempt = job.attempt + 1,
        started_at = now(), last_attempted_at = now()
    FROM picked WHERE job.id = picked.id
    RETURNING job.id, job.task_path
"""
FINISH = """
    UPDATE stalwart_job SET status = 'successful', finished_at = now()
    WHERE id = ANY(%s)
"""


def noop_body() -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--body", choices=["noop", "insert"], required=True)
    args = parser.parse_args()

    import django

    django.setup()
    import psycopg
    from django.conf import settings

    from benchmarks.tasks import write_record

    body = write_record if args.body == "insert" else noop_body
    db = settings.DATABASES["default"]
    conn = psycopg.connect(
        host=db["HOST"],
        port=db["PORT"],
        user=db["USER"],
        password=db["PASSWORD"],
        dbname=db["NAME"],
        autocommit=True,
    )
    with ThreadPoolExecutor(args.threads) as pool:
        while True:
            ids = [row[0] for row in conn.execute(CLAIM, [args.threads]).fetchall()]
            if not ids:
                time.sleep(0.005)
                continue
            for _ in pool.map(lambda _id: body(), ids):
                pass
            conn.execute(FINISH, [ids])


if __name__ == "__main__":
    main()
