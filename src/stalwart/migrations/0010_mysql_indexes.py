"""MySQL and MariaDB: indexes that serve the queries the partial indexes serve elsewhere.

Neither database has partial indexes. Django builds a model's conditional index there as a
plain one, without its condition (and skips a conditional unique constraint altogether,
with the warnings models.W036/W037). So, on MySQL only:

- each conditional index is rebuilt under its own name with the columns of its condition
  first (``status``, then what it was on), so that the claim's ``WHERE status = 'ready' AND
  queue_name = … ORDER BY priority DESC, available_at, id`` reads the head of one index range,
  as it does on PostgreSQL's partial index (``isolated``, which the claim also matches on,
  comes second), instead of filtering every finished job;
- the unique index on waiting jobs' keys (``stalwart_job_unique_waiting``) becomes a
  generated column, ``unique_holder``: the job's unique key while it holds it (waiting, or
  running if unique while running) and NULL otherwise, with a UNIQUE index. NULLs never
  collide, so it refuses exactly what the partial unique index refuses.

The model does not know of ``unique_holder``: it is the database's own bookkeeping, written by
the server alone (PostgreSQL and SQLite need no such column). Nothing happens on other
databases. DDL on MySQL commits as it goes, so this migration is not atomic.
"""

from django.db import migrations

# name: columns, condition first (as the conditional index's condition has it).
INDEXES = {
    # The claim also says which kind of job it takes (isolated or not): an equality too.
    "stalwart_job_claim_queue": "status, isolated, queue_name, priority DESC, available_at, id",
    "stalwart_job_claim_any": "status, isolated, priority DESC, available_at, id",
    "stalwart_job_due": "status, available_at, id",
    "stalwart_job_owner": "status, owner",
    "stalwart_job_blocked": "status, concurrency_key, priority DESC, available_at, id",
    "stalwart_job_slot_holders": "concurrency_key, status",
    "stalwart_job_isolated": "status, isolated, queue_name",
    "stalwart_job_failed": "status, queue_name, finished_at",
    "stalwart_job_failed_task": "status, task_path, finished_at",
    "stalwart_job_failed_id": "status, id",
    "stalwart_job_waiting_queue": "status, queue_name",
}
# As Django built them (the model's fields without the condition), for going back.
PLAIN = {
    "stalwart_job_claim_queue": "queue_name, priority DESC, available_at, id",
    "stalwart_job_claim_any": "priority DESC, available_at, id",
    "stalwart_job_due": "available_at",
    "stalwart_job_owner": "owner",
    "stalwart_job_blocked": "concurrency_key, priority DESC, available_at, id",
    "stalwart_job_slot_holders": "concurrency_key",
    "stalwart_job_isolated": "queue_name",
    "stalwart_job_failed": "queue_name, finished_at",
    "stalwart_job_failed_task": "task_path, finished_at",
    "stalwart_job_failed_id": "id",
    "stalwart_job_waiting_queue": "queue_name",
}
# The partial unique index's predicate (stalwart.models.job.UNIQUE_STATES).
UNIQUE_HOLDER = """
ALTER TABLE stalwart_job
ADD COLUMN unique_holder varchar(64) AS (
    CASE WHEN status IN ('scheduled', 'blocked', 'ready')
           OR (status = 'running' AND unique_while_running)
         THEN unique_key END
) STORED,
ADD UNIQUE INDEX stalwart_job_unique_waiting (unique_holder)
"""


def _rebuild(schema_editor, columns_by_name):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        existing = connection.introspection.get_constraints(cursor, "stalwart_job")
    for name, columns in columns_by_name.items():
        drop = f"DROP INDEX {name}, " if name in existing else ""
        schema_editor.execute(f"ALTER TABLE stalwart_job {drop}ADD INDEX {name} ({columns})")


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    _rebuild(schema_editor, INDEXES)
    schema_editor.execute(UNIQUE_HOLDER)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "ALTER TABLE stalwart_job DROP INDEX stalwart_job_unique_waiting, "
        "DROP COLUMN unique_holder"
    )
    _rebuild(schema_editor, PLAIN)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("stalwart", "0009_scale_indexes"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards),
    ]
