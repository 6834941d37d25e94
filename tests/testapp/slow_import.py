"""A task module that takes ``STALWART_SLOW_IMPORT`` seconds to import (a project whose task
modules load a large model, or warm a cache, as they are imported)."""

import os
import time

from django.tasks import TaskContext, task

time.sleep(float(os.environ.get("STALWART_SLOW_IMPORT", "0")))  # the import's own work


@task(takes_context=True)
def slowly_imported(context: TaskContext, seconds: float = 0.0) -> int:
    from tests.testapp.tasks import _ledgered

    return _ledgered(context, seconds)
