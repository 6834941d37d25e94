"""Tasks outside the app's ``tasks`` module: workers run them only when this module is in
``OPTIONS["task_modules"]`` (``STALWART_TASK_MODULES`` in the test settings)."""

import os

from django.tasks import TaskContext, task
from django.utils import timezone

from tests.testapp.models import Execution


@task(takes_context=True)
def record_outside(context: TaskContext) -> int:
    Execution.objects.create(
        job_id=context.task_result.id,
        label="outside",
        attempt=context.attempt,
        pid=os.getpid(),
        started_at=timezone.now(),
        finished_at=timezone.now(),
    )
    return os.getpid()
