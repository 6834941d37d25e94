"""What a scrape reports, in Prometheus's text format: per-queue gauges read from the job
table at that moment (``collect_status``, the same figures as ``queue status``), and the
counters and histogram that every process adds to ``stalwart_counter``."""

import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from stalwart.conf import Options

PREFIX = "stalwart"
COUNTERS = {
    "enqueued": "Jobs enqueued.",
    "succeeded": "Attempts that succeeded.",
    "failed": "Jobs failed for good.",
    "retried": "Retries: after a failed attempt (a worker's death charged to the job "
    "included), or asked for by hand.",
    "interrupted": "Attempts interrupted by the queue or its environment (an outage, a stop, "
    "a neighbour's crash): run again, free up to the job's max_interruptions.",
    "timed_out": "Attempts that ran past their task's timeout.",
    "released": "Jobs given back to the queue by a stopping process.",
    "discarded": "Failed jobs discarded.",
    "cancelled": "Jobs cancelled (waiting ones at once, running ones that stopped).",
}
STATES = ("ready", "scheduled", "running", "blocked", "failed")


def _families(config: Options) -> Iterator[Any]:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    from stalwart.models import Counter
    from stalwart.status import collect_status

    status = collect_status(config)
    jobs = GaugeMetricFamily(
        f"{PREFIX}_queue_jobs", "Jobs in each queue, by state.", labels=["queue", "state"]
    )
    oldest = GaugeMetricFamily(
        f"{PREFIX}_queue_oldest_ready_age_seconds",
        "How long the oldest ready job of each queue has waited (0 when none waits).",
        labels=["queue"],
    )
    paused = GaugeMetricFamily(
        f"{PREFIX}_queue_paused", "1 if the queue is paused, else 0.", labels=["queue"]
    )
    serving = GaugeMetricFamily(
        f"{PREFIX}_queue_workers", "Live worker processes serving each queue.", labels=["queue"]
    )
    for queue in status.queues:
        for state in STATES:
            jobs.add_metric([queue.name, state], getattr(queue, state))
        oldest.add_metric([queue.name], queue.oldest_ready_age_seconds or 0.0)
        paused.add_metric([queue.name], 1.0 if queue.paused else 0.0)
        serving.add_metric([queue.name], queue.served_by)
    processes = GaugeMetricFamily(
        f"{PREFIX}_processes",
        "Registered processes, by kind and whether they are alive.",
        labels=["kind", "alive"],
    )
    counted: dict[tuple[str, str], int] = defaultdict(int)
    for process in status.processes:
        counted[process.kind, "true" if process.alive else "false"] += 1
    for (kind, alive), number in sorted(counted.items()):
        processes.add_metric([kind, alive], number)
    yield from (jobs, oldest, paused, serving, processes)

    rows = Counter.objects.using(config.database).values_list(
        "name", "queue_name", "task_path", "le", "value"
    )
    counters = {
        name: CounterMetricFamily(f"{PREFIX}_jobs_{name}", help_text, labels=["queue", "task"])
        for name, help_text in COUNTERS.items()
    }
    buckets: dict[str, dict[str, float]] = defaultdict(dict)
    sums: dict[str, float] = defaultdict(float)
    for name, queue_name, task, le, value in rows:
        if name in counters:
            counters[name].add_metric([queue_name, task], value)
        elif name == "duration_bucket":
            buckets[task][le] = value
        elif name == "duration_sum":
            sums[task] = value
    yield from counters.values()
    durations = HistogramMetricFamily(
        f"{PREFIX}_job_duration_seconds",
        "How long attempts ran, by task (whatever their outcome).",
        labels=["task"],
    )
    for task in sorted(buckets):
        bounds = sorted(buckets[task].items(), key=lambda item: _bound(item[0]))
        durations.add_metric([task], buckets=bounds, sum_value=sums.get(task, 0.0))
    yield durations


def _bound(le: str) -> float:
    return math.inf if le == "+Inf" else float(le)


class StalwartCollector:
    """A ``prometheus_client`` collector for one Stalwart backend."""

    def __init__(self, config: Options) -> None:
        self.config = config

    def collect(self) -> Iterator[Any]:
        return _families(self.config)


def exposition(config: Options) -> tuple[bytes, str]:
    """The metrics in Prometheus's text format, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StalwartCollector(config))
    return generate_latest(registry), CONTENT_TYPE_LATEST
