"""The demo's log lines: short, and the failure the demo causes on purpose said to be one."""

import logging

# The demo's task that raises, to show what a failed job looks like.
FAILS_ON_PURPOSE = "shop.tasks.charge_card"
ON_PURPOSE = "(this job fails on purpose)"


class OnPurpose(logging.Filter):
    """Replace the traceback of the failure the demo causes by a note saying so."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = getattr(record, "stalwart", None) or {}
        if getattr(record, "action", None) == "job_failed" and fields.get("task") == (
            FAILS_ON_PURPOSE
        ):
            record.msg = f"{record.getMessage().splitlines()[0]}  {ON_PURPOSE}"
            record.args = ()
        return True
