"""The log lines events become: one line per event, values quoted and escaped."""

import logging

from stalwart.log import log_event


def test_values_with_line_breaks_and_quotes_stay_on_one_line(caplog):
    caplog.set_level(logging.INFO, logger="stalwart")
    error = (
        "OperationalError: connection failed: port 5499 failed: Connection refused"
        '\n\tIs the "server" running?'
    )
    log_event("database_unavailable", {"process": "worker-1", "error": error, "count": 3})
    [record] = caplog.records
    assert record.getMessage() == (
        "action=database_unavailable process=worker-1 "
        'error="OperationalError: connection failed: port 5499 failed: Connection refused'
        '\\n\\tIs the \\"server\\" running?" count=3'
    )
    assert "\n" not in record.getMessage()
    assert record.stalwart["error"] == error  # structured handlers get the value as it was


def test_plain_values_are_left_bare_and_others_quoted(caplog):
    caplog.set_level(logging.INFO, logger="stalwart")
    log_event("queue_paused", {"queue": "emails", "reason": "", "path": "a=b", "ratio": 0.5})
    assert caplog.records[0].getMessage() == (
        'action=queue_paused queue=emails reason="" path="a=b" ratio=0.5'
    )


def test_a_traceback_follows_the_line_it_belongs_to(caplog):
    caplog.set_level(logging.INFO, logger="stalwart")
    log_event("job_failed", {"job": "1", "traceback": "Traceback (most recent call last):\n  x\n"})
    assert caplog.records[0].getMessage() == (
        "action=job_failed job=1\nTraceback (most recent call last):\n  x"
    )
