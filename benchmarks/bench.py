"""Stalwart's benchmark: prints enqueue rates, drain rates and pick-up latency.

    python benchmarks/bench.py [--jobs 10000] [--threads 10]

Uses PostgreSQL (database ``stalwart_bench``, created and migrated here) unless
``STALWART_BENCH_DATABASE=sqlite`` or ``STALWART_BENCH_DATABASE=mysql`` (MariaDB/MySQL).
Figures are printed, never asserted: speed is a measurement, not a test.
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Always the benchmark's own settings: it deletes every job and process row where it runs.
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"


def prepare_database() -> None:
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("postgresql"):
        import psycopg

        with psycopg.connect(
            host=db["HOST"],
            port=db["PORT"],
            user=db["USER"],
            password=db["PASSWORD"],
            dbname="postgres",
            autocommit=True,
        ) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]
            ).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{db["NAME"]}"')
    elif db["ENGINE"].endswith("mysql"):
        import MySQLdb

        conn = MySQLdb.connect(
            host=db["HOST"], port=int(db["PORT"]), user=db["USER"], password=db["PASSWORD"]
        )
        try:
            conn.cursor().execute(
                f"CREATE DATABASE IF NOT EXISTS `{db['NAME']}` "
                "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
            )
        finally:
            conn.close()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def clear_jobs() -> None:
    """Start each phase from an empty, vacuumed table, as autovacuum keeps a live one.

    Deleted rows leave dead entries at the head of the claim's index until vacuum removes
    them; without this, each phase would pay for the previous phase's garbage.
    """
    from django.db import connection

    from stalwart.models import Job, Process

    Job.objects.all().delete()
    Process.objects.all().delete()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE stalwart_job")


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:>10,.0f} jobs/s  ({count:,} in {seconds:.2f} s)"


def bench_single_enqueue(count: int) -> None:
    from benchmarks.tasks import noop

    for _ in range(50):  # warm up connections and caches
        noop.enqueue()
    clear_jobs()
    start = time.perf_counter()
    for _ in range(count):
        noop.enqueue()
    print(f"{'single enqueue':<28}{rate(count, time.perf_counter() - start)}")
    clear_jobs()


def bench_bulk_enqueue(count: int) -> None:
    from benchmarks.tasks import noop
    from stalwart import Call, enqueue_many

    start = time.perf_counter()
    batch = 5000
    for offset in range(0, count, batch):
        enqueue_many(noop, [Call() for _ in range(min(batch, count - offset))])
    print(f"{'bulk enqueue':<28}{rate(count, time.perf_counter() - start)}")
    clear_jobs()


def start_workers(processes: int, threads: int) -> list[subprocess.Popen]:
    from django.db import connections

    connections.close_all()
    return [
        subprocess.Popen(
            [sys.executable, "-m", "django", "queue", "work", "--threads", str(threads), "-v", "0"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for _ in range(processes)
    ]


def stop_workers(workers: list[subprocess.Popen]) -> None:
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def wait_registered(count: int) -> None:
    from stalwart.models import Process

    deadline = time.monotonic() + 30
    while Process.objects.filter(kind="worker").count() < count:
        if time.monotonic() > deadline:
            raise SystemExit("workers did not start within 30 s")
        time.sleep(0.05)


def unfinished() -> bool:
    """Whether any job is still ready or running (each test uses a partial index: cheap)."""
    from stalwart.models import Job

    return (
        Job.objects.filter(status="ready").exists() or Job.objects.filter(status="running").exists()
    )


def bench_drain(count: int, processes: int, threads: int) -> None:
    from benchmarks.tasks import noop
    from stalwart import Call, enqueue_many

    workers = start_workers(processes, threads)
    try:
        wait_registered(processes)
        from django.db import transaction

        with transaction.atomic():
            enqueue_many(noop, [Call() for _ in range(count)])
        start = time.perf_counter()
        while unfinished():
            time.sleep(0.02)
        elapsed = time.perf_counter() - start
    finally:
        stop_workers(workers)
    label = f"drain, {processes} proc x {threads} threads"
    print(f"{label:<28}{rate(count, elapsed)}")
    clear_jobs()


def bench_latency(samples: int) -> None:
    from benchmarks.tasks import stamp

    workers = start_workers(1, 4)
    latencies = []
    try:
        wait_registered(1)
        time.sleep(1.0)  # let the worker go idle (LISTEN established, first poll done)
        for _ in range(samples):
            enqueued = time.time()
            result = stamp.enqueue()
            while True:
                result.refresh()
                if result.is_finished:
                    break
                time.sleep(0.001)
            latencies.append((result.return_value - enqueued) * 1000)
            time.sleep(0.02)  # idle again before the next sample
    finally:
        stop_workers(workers)
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(f"{'pick-up latency, idle':<28}p50 {p50:.1f} ms, p99 {p99:.1f} ms ({samples} samples)")
    clear_jobs()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per drain run")
    parser.add_argument("--enqueues", type=int, default=3_000, help="single enqueues timed")
    parser.add_argument("--bulk", type=int, default=50_000, help="jobs bulk-enqueued")
    parser.add_argument("--threads", type=int, default=10, help="threads per worker process")
    parser.add_argument("--samples", type=int, default=200, help="latency samples")
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection

    prepare_database()
    clear_jobs()
    print(
        f"stalwart benchmark on {connection.vendor} ({connection.settings_dict['NAME']}), "
        f"{os.cpu_count()} CPUs"
    )
    bench_single_enqueue(args.enqueues)
    bench_bulk_enqueue(args.bulk)
    bench_drain(args.jobs, 1, args.threads)
    bench_drain(args.jobs, 2, args.threads)
    bench_latency(args.samples)


if __name__ == "__main__":
    main()
