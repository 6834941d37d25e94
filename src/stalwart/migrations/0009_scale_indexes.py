"""Indexes that keep bulk retries and ``--stop-when-empty`` flat on a table of millions.

- ``stalwart_job_failed_id``: failed jobs in id order, which a retry or a discard of many
  goes through in batches (each from where the last ended), reading no other rows.
- ``stalwart_job_waiting_queue``: the queues with scheduled or blocked jobs, listed by one
  index descent per queue.

On PostgreSQL each index is built ``CONCURRENTLY`` (so the migration is not atomic): the
job table keeps taking writes while it is built, however big it is. On SQLite the index is
built as usual.
"""

from django.db import migrations, models


class AddIndexConcurrently(migrations.AddIndex):
    """``AddIndex``, built without blocking writes on PostgreSQL."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        connection = schema_editor.connection
        if not self.allow_migrate_model(connection.alias, model):
            return
        if connection.vendor != "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        # (A build that failed half-way leaves an invalid index: drop it, then build again.)
        name = schema_editor.quote_name(self.index.name)
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        schema_editor.execute(self.index.create_sql(model, schema_editor, concurrently=True))

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        connection = schema_editor.connection
        if not self.allow_migrate_model(connection.alias, model):
            return
        if connection.vendor != "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
            return
        schema_editor.execute(
            f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(self.index.name)}"
        )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("stalwart", "0008_priority_range"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "failed")),
                fields=["id"],
                name="stalwart_job_failed_id",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status__in", ["scheduled", "blocked"])),
                fields=["queue_name"],
                name="stalwart_job_waiting_queue",
            ),
        ),
    ]
