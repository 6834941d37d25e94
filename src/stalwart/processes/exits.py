"""Exit statuses of Stalwart's processes, which a supervisor (or systemd) tells apart."""

EXIT_OK = 0
EXIT_CRASHED = 1  # an unexpected error ended the main loop
EXIT_FENCED = 3  # our row was pruned, or heartbeats failed too long: we stopped on our own
EXIT_RECYCLE = 4  # memory or job-count limit reached, or a job timed out: replace me
