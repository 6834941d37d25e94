"""Stalwart's benchmark: prints enqueue rates, drain rates, pick-up latency and idle cost,
each beside a reference measured in the same run, and the ratio.

    python benchmarks/bench.py [--jobs 10000] [--threads 10]

Uses PostgreSQL (database ``stalwart_bench``, created and migrated here) unless
``STALWART_BENCH_DATABASE=sqlite`` or ``STALWART_BENCH_DATABASE=mysql`` (MariaDB/MySQL),
then without the references and steps that need PostgreSQL. Figures are printed, never
asserted: speed is a measurement, not a test.

The references: a bare Django ``Model.objects.create()`` of a row shaped like a job's, for a
single enqueue; PostgreSQL's ``COPY`` of the rows ``enqueue_many()`` writes, for a bulk
enqueue; a bare worker (``benchmarks/bare.py``) at the same process and thread counts, for
each drain. Reference and Stalwart alternate in rounds, so that a machine shared with other
work slows both alike.
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Always the benchmark's own settings: it deletes every job and process row where it runs.
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"

ROUNDS = 4  # rounds in which reference and Stalwart alternate, for the enqueue figures


def prepare_database() -> None:
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("postgresql"):
        with server_connection() as conn:
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

    # run_syncdb: the benchmark's own tables (benchmarks.models has no migrations).
    call_command("migrate", verbosity=0, run_syncdb=True)


def filled_table(jobs: int, *, keep: bool, fill: Callable[[int], None]) -> None:
    """Fill the job table with ``fill`` (about ``jobs`` rows), or with ``keep`` reuse what an
    earlier run left there. Django is set up first, by the caller: importing this module
    sets the settings module to this benchmark's own."""
    prepare_database()
    from stalwart.models import Job

    started = time.monotonic()
    if not (keep and Job.objects.count() >= jobs * 0.99):
        print(f"Filling the job table with {jobs:,} jobs…", flush=True)
        fill(jobs)
    print(f"{Job.objects.count():,} jobs ({time.monotonic() - started:.0f} s to prepare).\n")


def server_connection():
    """A connection to the server's ``postgres`` database: not counted in the bench's own."""
    import psycopg
    from django.conf import settings

    db = settings.DATABASES["default"]
    return psycopg.connect(
        host=db["HOST"],
        port=db["PORT"],
        user=db["USER"],
        password=db["PASSWORD"],
        dbname="postgres",
        autocommit=True,
    )


def clear_jobs() -> None:
    """Start each phase from an empty, vacuumed table, as autovacuum keeps a live one.

    Deleted rows leave dead entries at the head of the claim's index until vacuum removes
    them; without this, each phase would pay for the previous phase's garbage.
    """
    from django.db import connection

    from benchmarks.models import JobSizedRow, Record
    from stalwart.models import Job, Process

    Job.objects.all().delete()
    Process.objects.all().delete()
    Record.objects.all().delete()
    JobSizedRow.objects.all().delete()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for table in ("stalwart_job", "benchmarks_record", "benchmarks_jobsizedrow"):
                cursor.execute(f"VACUUM ANALYZE {table}")


def analyze_jobs() -> None:
    """Statistics for the backlog just enqueued, as autovacuum keeps for a live table:
    planned from the empty table's, a claim would sort every ready row (both workers' alike).
    Run in the enqueue's transaction, so that no worker sees the jobs before the clock runs."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE stalwart_job")


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:>10,.0f} jobs/s  ({count:,} in {seconds:.2f} s)"


def report(label: str, count: int, seconds: float, reference: float | None = None) -> float:
    """Print one figure (and its ratio to ``reference``, jobs/s); return its jobs/s."""
    per_second = count / seconds
    ratio = f"   {per_second / reference:>4.0%} of the reference" if reference else ""
    print(f"{label:<38}{rate(count, seconds)}{ratio}")
    return per_second


def postgresql() -> bool:
    from django.db import connection

    return connection.vendor == "postgresql"


# -- enqueue ---------------------------------------------------------------------------------


def create_job_sized_row() -> None:
    from django.utils import timezone

    from benchmarks.models import JobSizedRow

    now = timezone.now()
    JobSizedRow.objects.create(
        task_path="benchmarks.tasks.noop",
        backend="default",
        queue_name="default",
        priority=0,
        status="ready",
        args=[],
        kwargs={},
        run_after=None,
        available_at=now,
        enqueued_at=now,
        max_attempts=5,
        attempt=0,
        worker_ids=[],
        errors=[],
    )


def bench_single_enqueue(count: int) -> None:
    from benchmarks.tasks import noop

    for _ in range(50):  # warm up connections and caches
        noop.enqueue()
        create_job_sized_row()
    clear_jobs()
    per_round = max(1, count // ROUNDS)
    ours = reference = 0.0
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(per_round):
            create_job_sized_row()
        reference += time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(per_round):
            noop.enqueue()
        ours += time.perf_counter() - start
    done = per_round * ROUNDS
    base = report("ref: Model.objects.create()", done, reference)
    report("single enqueue", done, ours, base)
    clear_jobs()


def copy_rows(count: int, batch: int) -> float:
    """COPY ``count`` rows like those ``enqueue_many(noop, ...)`` writes into the job table,
    in transactions of ``batch`` rows; return the seconds it took."""
    from django.db import connection

    from benchmarks.tasks import noop
    from stalwart import Call, enqueue_many

    enqueue_many(noop, [Call()])  # a template row, with every column as an enqueue sets it
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM stalwart_job LIMIT 1")
        columns = [column.name for column in cursor.description]
        template = list(cursor.fetchone())
        cursor.execute("DELETE FROM stalwart_job")
    raw = connection.connection
    json_columns = {"args", "kwargs", "worker_ids", "errors", "return_value"}
    from psycopg.types.json import Jsonb

    for index, name in enumerate(columns):
        if name in json_columns and template[index] is not None:
            template[index] = Jsonb(template[index])
    id_at = columns.index("id")
    start = time.perf_counter()
    for offset in range(0, count, batch):
        with (
            raw.transaction(),
            raw.cursor() as cursor,
            cursor.copy(f"COPY stalwart_job ({', '.join(columns)}) FROM STDIN") as copy,
        ):
            for _ in range(min(batch, count - offset)):
                template[id_at] = uuid.uuid4()
                copy.write_row(template)
    return time.perf_counter() - start


def bulk_enqueue(count: int, batch: int) -> float:
    from benchmarks.tasks import noop
    from stalwart import Call, enqueue_many

    start = time.perf_counter()
    for offset in range(0, count, batch):
        enqueue_many(noop, [Call() for _ in range(min(batch, count - offset))])
    return time.perf_counter() - start


def bench_bulk_enqueue(count: int) -> None:
    batch = 5000
    per_round = max(batch, count // ROUNDS)
    ours = reference = 0.0
    for _ in range(ROUNDS):
        if postgresql():
            reference += copy_rows(per_round, batch)
            clear_jobs()
        ours += bulk_enqueue(per_round, batch)
        clear_jobs()
    done = per_round * ROUNDS
    base = report("ref: COPY of the same rows", done, reference) if postgresql() else None
    report("bulk enqueue (enqueue_many)", done, ours, base)


# -- drain -----------------------------------------------------------------------------------


def python_path() -> str:
    """The benchmark's root first (for its settings), then any PYTHONPATH given: so another
    checkout's ``src`` can be measured with the same benchmark."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def start_processes(command: list[str], count: int) -> list[subprocess.Popen]:
    from django.db import connections

    connections.close_all()
    return [
        subprocess.Popen(
            [sys.executable, *command],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": python_path()},
        )
        for _ in range(count)
    ]


def start_workers(processes: int, threads: int) -> list[subprocess.Popen]:
    command = ["-m", "django", "queue", "work", "--threads", str(threads), "-v", "0"]
    return start_processes(command, processes)


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


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user and system) these processes have used so far, all threads included."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def backend_pids() -> list[int]:
    """The server processes of the benchmark's database but this one's own, when the
    server runs on this machine (else none: their CPU cannot be read from here)."""
    import psutil
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        pids = [row[0] for row in cursor.fetchall()]
    local = []
    for pid in pids:
        try:
            if psutil.Process(pid).name().startswith("postgres"):
                local.append(pid)
        except psutil.Error:
            continue
    return local


class CpuMeter:
    """CPU per job of a drain, in microseconds: the worker processes', and their server
    processes' (PostgreSQL on this machine). Less noisy than a rate on a shared machine:
    another program's load slows a drain, but barely changes what each job costs."""

    def __init__(self, workers: list[subprocess.Popen]) -> None:
        self.workers = [worker.pid for worker in workers]
        self.database = postgresql()
        self.backends: dict[int, float] = {}
        self.worker_start = cpu_seconds(self.workers)
        if self.database:
            self.backends = {pid: cpu_seconds([pid]) for pid in backend_pids()}

    def per_job(self, count: int) -> str:
        worker = cpu_seconds(self.workers) - self.worker_start
        text = f"worker CPU {worker / count * 1e6:.0f} µs/job"
        if self.database:
            # A server process born during the drain (a job thread's connection) counts whole.
            backend = sum(
                cpu_seconds([pid]) - self.backends.get(pid, 0.0) for pid in backend_pids()
            )
            text += f", server {backend / count * 1e6:.0f} µs/job"
        return text


def drain(
    task_name: str, count: int, processes: int, threads: int, *, bare: bool
) -> tuple[float, str]:
    """Seconds ``processes`` workers of ``threads`` threads take to run ``count`` jobs of
    ``task_name`` (Stalwart's ``queue work``, or the bare worker), and the CPU per job."""
    import benchmarks.tasks
    from stalwart import Call, enqueue_many

    task = getattr(benchmarks.tasks, task_name)
    if bare:
        body = "insert" if task_name == "insert_one" else "noop"
        command = ["-m", "benchmarks.bare", "--threads", str(threads), "--body", body]
        workers = start_processes(command, processes)
    else:
        workers = start_workers(processes, threads)
    try:
        if bare:
            time.sleep(2.0)  # no process row to wait for: give them time to start polling
        else:
            wait_registered(processes)
        from django.db import transaction

        meter = CpuMeter(workers)
        with transaction.atomic():  # the clock starts at the commit: the workers' NOTIFY
            enqueue_many(task, [Call() for _ in range(count)])
            analyze_jobs()
        start = time.perf_counter()
        while unfinished():
            time.sleep(0.02)
        elapsed = time.perf_counter() - start
        cpu = meter.per_job(count)
    finally:
        stop_workers(workers)
    clear_jobs()
    return elapsed, cpu


def bench_drain(task_name: str, count: int, processes: int, threads: int) -> None:
    what = "no-op" if task_name == "noop" else "one-insert"
    shape = f"{processes} proc x {threads} threads"
    base = None
    if postgresql():
        seconds, cpu = drain(task_name, count, processes, threads, bare=True)
        base = report(f"ref: bare worker, {what}, {shape}", count, seconds)
        print(f"{'':<38}{cpu}")
    seconds, cpu = drain(task_name, count, processes, threads, bare=False)
    report(f"drain, {what}, {shape}", count, seconds, base)
    print(f"{'':<38}{cpu}")


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
    print(f"{'pick-up latency, idle':<38}p50 {p50:.1f} ms, p99 {p99:.1f} ms ({samples} samples)")
    clear_jobs()


# -- idle ------------------------------------------------------------------------------------


def transactions(database: str) -> int:
    """Transactions the server has counted in ``database`` (committed and rolled back)."""
    with server_connection() as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            [database],
        ).fetchone()[0]


def server_log() -> Path | None:
    """The server's log file, if this process can read it (``STALWART_BENCH_PG_LOG``, the
    logging collector's current file, or Debian's default)."""
    candidates = [os.environ.get("STALWART_BENCH_PG_LOG")]
    with server_connection() as conn:
        current = conn.execute("SELECT pg_current_logfile()").fetchone()[0]
        directory = conn.execute("SELECT current_setting('data_directory')").fetchone()[0]
        version = conn.execute("SELECT current_setting('server_version_num')").fetchone()[0]
    if current:
        candidates.append(current if current.startswith("/") else f"{directory}/{current}")
    candidates.append(f"/var/log/postgresql/postgresql-{int(version) // 10000}-main.log")
    for candidate in candidates:
        if candidate and os.access(candidate, os.R_OK):
            return Path(candidate)
    return None


def backends_by_process(database: str, pids: dict[int, str]) -> dict[str, str]:
    """Which of our processes (``pids``: pid -> role) holds each server backend of
    ``database``, by the client port of the backend's connection."""
    import psutil

    port_owner = {}
    for pid, role in pids.items():
        try:
            for conn in psutil.Process(pid).net_connections(kind="inet"):
                if conn.laddr:
                    port_owner[conn.laddr.port] = role
        except psutil.Error:
            continue
    with server_connection() as conn:
        rows = conn.execute(
            "SELECT pid, client_port FROM pg_stat_activity WHERE datname = %s", [database]
        ).fetchall()
    return {str(pid): port_owner.get(port, "other") for pid, port in rows}


def tree_roles(tree: subprocess.Popen) -> dict[int, str]:
    import psutil

    roles = {tree.pid: "supervisor"}
    for child in psutil.Process(tree.pid).children():
        try:
            title = " ".join(child.cmdline())  # setproctitle: "stalwart worker [...] idle"
        except psutil.Error:
            continue
        for kind in ("worker", "dispatcher", "scheduler"):
            if f"stalwart {kind}" in title:
                roles[child.pid] = kind
    return roles


def bench_idle(seconds: float) -> None:
    """Statements per second of an idle supervised tree: supervisor, 1 worker, 1 dispatcher,
    scheduler (one recurring task, not due soon), at the default heartbeat interval.

    Counted in the server's log where the benchmark can read it: ``log_statement = 'all'``
    is set on the benchmark's own database for the window (and reset after), and each
    statement is charged to the process whose connection sent it (matched by client port).
    Otherwise, counted as transactions in ``pg_stat_database`` (each autocommitted statement
    is one): the server files those up to ten seconds late, so a window's count may include
    some of the start.
    """
    from django.conf import settings
    from django.db import connections

    database = settings.DATABASES["default"]["NAME"]
    log = server_log()
    if log is not None:
        with server_connection() as conn:
            conn.execute(f"ALTER DATABASE \"{database}\" SET log_statement = 'all'")
    command = ["-m", "django", "queue", "supervise", "--processes", "1", "--threads", "5"]
    command += ["--dispatchers", "1", "-v", "0"]
    connections.close_all()
    tree = subprocess.Popen(
        [sys.executable, *command],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": python_path(), "STALWART_BENCH_HEARTBEAT": "10"},
    )
    try:
        time.sleep(15.0)  # start, register, first heartbeats and chores, settle
        roles = tree_roles(tree)
        before = transactions(database)
        offset = log.stat().st_size if log is not None else 0
        time.sleep(seconds)
        after = transactions(database)
        # The window ends here: the statements of the tree's shutdown are not idle cost.
        end = log.stat().st_size if log is not None else 0
        backends = backends_by_process(database, roles) if log is not None else {}
    finally:
        stop_workers([tree])
        if log is not None:
            with server_connection() as conn:
                conn.execute(f'ALTER DATABASE "{database}" RESET log_statement')
    if log is None:
        total = (after - before) / seconds
        print(f"{'idle: transactions/s, whole tree':<38}{total:>10.2f}  (pg_stat_database)")
        print(f"{'idle: transactions/s per process':<38}{total / 4:>10.2f}  (4 processes)")
        clear_jobs()
        return
    import re

    with log.open("rb") as file:
        file.seek(offset)
        text = file.read(end - offset).decode(errors="replace")
    pattern = re.compile(rf"\[(\d+)\] \S*@{re.escape(database)} LOG:  (?:statement|execute)")
    counts = dict.fromkeys(("supervisor", "worker", "dispatcher", "scheduler"), 0)
    for match in pattern.finditer(text):
        role = backends.get(match.group(1), "other")
        counts[role] = counts.get(role, 0) + 1
    total = sum(counts.values())
    print(
        f"{'idle: statements/s, whole tree':<38}{total / seconds:>10.2f}  "
        f"({total} in {seconds:.0f} s, from the server's log)"
    )
    for role, count in counts.items():
        print(f"{'idle: statements/s, ' + role:<38}{count / seconds:>10.2f}")
    clear_jobs()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per drain run")
    parser.add_argument("--enqueues", type=int, default=3_000, help="single enqueues timed")
    parser.add_argument("--bulk", type=int, default=50_000, help="jobs bulk-enqueued")
    parser.add_argument("--threads", type=int, default=10, help="threads, no-op drains")
    parser.add_argument("--insert-threads", type=int, default=5, help="threads, one-insert drains")
    parser.add_argument("--processes", type=int, default=2, help="worker processes per drain")
    parser.add_argument("--samples", type=int, default=200, help="latency samples")
    parser.add_argument("--idle-seconds", type=float, default=40, help="idle window (0: skip)")
    parser.add_argument(
        "--only",
        choices=["enqueue", "drain", "latency", "idle"],
        action="append",
        help="run only these steps (repeatable)",
    )
    args = parser.parse_args()
    steps = set(args.only or ["enqueue", "drain", "latency", "idle"])

    import django

    django.setup()
    from django.db import connection

    prepare_database()
    clear_jobs()
    print(
        f"stalwart benchmark on {connection.vendor} ({connection.settings_dict['NAME']}), "
        f"{os.cpu_count()} CPUs"
    )
    if "enqueue" in steps:
        bench_single_enqueue(args.enqueues)
        bench_bulk_enqueue(args.bulk)
    if "drain" in steps:
        bench_drain("noop", args.jobs, args.processes, args.threads)
        bench_drain("insert_one", args.jobs // 2, args.processes, args.insert_threads)
    if "latency" in steps:
        bench_latency(args.samples)
    if "idle" in steps and postgresql() and args.idle_seconds > 0:
        bench_idle(args.idle_seconds)


if __name__ == "__main__":
    main()
