"""The demo's tasks: what a small shop might run in the background."""

import asyncio
import time

from django.tasks import TaskContext, task


@task(queue_name="emails", priority=10)
def send_receipt(order_id: int, email: str) -> str:
    time.sleep(0.2)  # pretend to talk to a mail server
    return f"receipt for order {order_id} sent to {email}"


@task
def resize_image(name: str, width: int) -> dict:
    time.sleep(0.1)
    return {"image": name, "width": width}


@task
async def fetch_exchange_rate(currency: str) -> float:
    await asyncio.sleep(0.1)
    return {"EUR": 1.0, "GBP": 0.85, "USD": 1.08}[currency]


@task(takes_context=True)
def nightly_report(context: TaskContext) -> str:
    return f"report built by {context.task_result.worker_ids[-1]}"


@task
def charge_card(order_id: int) -> None:
    raise RuntimeError(f"card declined for order {order_id}")
