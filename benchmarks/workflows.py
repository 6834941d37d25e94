"""Stalwart's workflow benchmark: batches and dependencies, each beside the same jobs
without them, measured in the same run. Figures are printed, never asserted.

    python benchmarks/workflows.py [--jobs 100000] [--chain 200] [--fan-in 2000]

Uses the database ``benchmarks/bench.py`` uses (PostgreSQL unless
``STALWART_BENCH_DATABASE=sqlite`` or ``mysql``), through the same settings module: it
deletes every job, process, batch and dependency row where it runs.

- enqueue: ``batch.enqueue_many`` of N jobs, beside ``enqueue_many`` of the same N;
- drain: N jobs of a batch (and its callback), beside N jobs without a batch, by the same
  workers;
- chain: a chain of L links run by one worker: the gap between a link's end and the next
  link's start (median, p90), read from the job rows;
- fan-in: one job after P parents: the time from the last parent's end to its start;
- claims beside pending jobs: N ready jobs drained with P x 50 pending dependants present
  (their parents still waiting), beside the same drain with none.
"""

import argparse
import itertools
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from benchmarks import bench

PROCESSES = 2
THREADS = 10


def clear() -> None:
    from stalwart.models import Batch, BatchJob, Dependency

    Dependency.objects.all().delete()
    BatchJob.objects.all().delete()
    Batch.objects.all().delete()
    bench.clear_jobs()


def all_done() -> bool:
    from stalwart.models import Batch, Job

    waiting = ("pending", "scheduled", "blocked", "ready", "running")
    return (
        not Job.objects.filter(status__in=waiting).exists()
        and not Batch.objects.filter(finished_at__isnull=True).exists()
    )


def wait_done(timeout: float = 1800) -> float:
    start = time.perf_counter()
    while not all_done():
        if time.perf_counter() - start > timeout:
            raise SystemExit(f"not done within {timeout} s")
        time.sleep(0.02)
    return time.perf_counter() - start


def bench_enqueue(count: int) -> None:
    import stalwart
    from benchmarks.tasks import noop
    from stalwart import Call

    calls = [Call() for _ in range(count)]
    plain, batched = [], []
    for _ in range(2):  # alternate, so that a machine busy with other work slows both alike
        start = time.perf_counter()
        stalwart.enqueue_many(noop, calls)
        plain.append(time.perf_counter() - start)
        clear()
        start = time.perf_counter()
        with stalwart.batch(on_finish=noop) as batch:
            batch.enqueue_many(noop, calls)
        batched.append(time.perf_counter() - start)
        clear()
    reference = bench.report("ref: enqueue_many", count, min(plain))
    bench.report("batch.enqueue_many", count, min(batched), reference)


def drain(count: int, *, in_batch: bool) -> float:
    import stalwart
    from benchmarks.tasks import noop
    from stalwart import Call

    # Standalone workers promote due jobs, and finish batches, themselves.
    workers = bench.start_workers(PROCESSES, THREADS)
    try:
        bench.wait_registered(PROCESSES)
        from django.db import transaction

        with transaction.atomic():
            if in_batch:
                with stalwart.batch(on_finish=noop) as batch:
                    batch.enqueue_many(noop, [Call() for _ in range(count)])
            else:
                stalwart.enqueue_many(noop, [Call() for _ in range(count)])
            bench.analyze_jobs()
        seconds = wait_done()
    finally:
        bench.stop_workers(workers)
    clear()
    return seconds


def bench_drain(count: int) -> None:
    shape = f"{PROCESSES} proc x {THREADS} threads"
    reference = bench.report(f"ref: drain, no-op, {shape}", count, drain(count, in_batch=False))
    bench.report("drain of a batch + its callback", count, drain(count, in_batch=True), reference)


def gaps_ms(pairs: list[tuple[object, object]]) -> list[float]:
    return sorted((after - before).total_seconds() * 1000 for before, after in pairs)


def bench_chain(links: int) -> None:
    from benchmarks.tasks import noop
    from stalwart import chain
    from stalwart.models import Job

    workers = bench.start_workers(1, 4)
    try:
        bench.wait_registered(1)
        time.sleep(1.0)  # idle: listening, first poll done
        results = chain(*([noop] * links))
        wait_done()
        rows = {str(row.id): row for row in Job.objects.all()}
        jobs = [rows[result.id] for result in results]
    finally:
        bench.stop_workers(workers)
    clear()
    gaps = gaps_ms([(a.finished_at, b.started_at) for a, b in itertools.pairwise(jobs)])
    p90 = gaps[int(len(gaps) * 0.9)]
    print(
        f"{'chain: link end to next start':<38}median {statistics.median(gaps):.1f} ms, "
        f"p90 {p90:.1f} ms ({links} links, 1 proc x 4 threads)"
    )


def bench_fan_in(parents: int) -> None:
    import stalwart
    from benchmarks.tasks import noop
    from stalwart import Call
    from stalwart.models import Job

    workers = bench.start_workers(PROCESSES, THREADS)
    try:
        bench.wait_registered(PROCESSES)
        from django.db import transaction

        with transaction.atomic():
            results = stalwart.enqueue_many(noop, [Call() for _ in range(parents)])
            child = stalwart.enqueue_after(results, noop)
        wait_done()
        last = max(
            Job.objects.filter(pk__in=[r.id for r in results]).values_list("finished_at", flat=True)
        )
        started = Job.objects.get(pk=child.id).started_at
    finally:
        bench.stop_workers(workers)
    clear()
    waited = (started - last).total_seconds() * 1000
    print(f"{'fan-in: last parent end to child':<38}{waited:.1f} ms ({parents} parents)")


def drain_beside_pending(count: int, pending: int) -> float:
    from django.db import transaction
    from django.utils import timezone

    import stalwart
    from benchmarks.tasks import noop
    from stalwart import Call

    with transaction.atomic():
        if pending:
            # Parents due tomorrow: their dependants stay pending throughout.
            tomorrow = timezone.now() + timedelta(days=1)
            parents = stalwart.enqueue_many(
                noop.using(run_after=tomorrow), [Call() for _ in range(pending // 50)]
            )
            for parent in parents:
                for _ in range(50):
                    stalwart.enqueue_after([parent], noop)
        bench.analyze_jobs()
    workers = bench.start_workers(PROCESSES, THREADS)
    try:
        bench.wait_registered(PROCESSES)
        with transaction.atomic():
            stalwart.enqueue_many(noop, [Call() for _ in range(count)])
        start = time.perf_counter()
        while bench.unfinished():  # the pending jobs' parents are scheduled: not counted
            time.sleep(0.02)
        seconds = time.perf_counter() - start
    finally:
        bench.stop_workers(workers)
    clear()
    return seconds


def bench_beside_pending(count: int, pending: int) -> None:
    reference = bench.report("ref: drain, no pending jobs", count, drain_beside_pending(count, 0))
    bench.report(
        f"drain beside {pending:,} pending jobs",
        count,
        drain_beside_pending(count, pending),
        reference,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per batch")
    parser.add_argument("--drain-jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--chain", type=int, default=200, help="links of the chain")
    parser.add_argument("--fan-in", type=int, default=2_000, help="parents of the fan-in")
    parser.add_argument("--pending", type=int, default=20_000, help="pending dependants")
    parser.add_argument(
        "--only",
        choices=["enqueue", "drain", "chain", "fan-in", "pending"],
        action="append",
        help="run only these measurements (repeatable; default: all)",
    )
    args = parser.parse_args()
    chosen = set(args.only or ["enqueue", "drain", "chain", "fan-in", "pending"])

    import django

    django.setup()
    from django.db import connection

    bench.prepare_database()
    clear()
    print(f"stalwart workflow benchmark on {connection.vendor}, {bench.os.cpu_count()} CPUs")
    if "enqueue" in chosen:
        bench_enqueue(args.jobs)
    if "drain" in chosen:
        bench_drain(args.drain_jobs)
    if "chain" in chosen:
        bench_chain(args.chain)
    if "fan-in" in chosen:
        bench_fan_in(args.fan_in)
    if "pending" in chosen:
        bench_beside_pending(args.drain_jobs, args.pending)


if __name__ == "__main__":
    main()
