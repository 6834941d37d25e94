"""Metrics for Prometheus: gauges read from the job table when scraped, and counters and a
duration histogram that every process adds to a table of its own (``tally``).

Why the database, not ``prometheus_client``'s multiprocess mode: the processes that run jobs
are rarely the ones a scraper reaches (web processes), and often on other hosts. Counters in
the database add up across every process and host, survive restarts and deploys, and any
one web process can report the whole cluster. Each process adds what it counted every few
seconds, in one statement: nothing is written per job.
"""
