"""The database checks that a job's priority is within Django's range, -100 to 100.

On PostgreSQL the constraint is added ``NOT VALID``, then validated in a second statement:
adding it locks the table for a moment only, and validating it scans the table without
blocking reads or writes. So the migration is not atomic (on SQLite, where the table is
rebuilt, the rebuild is; on MySQL and MariaDB, whose DDL commits at once, it is one
``ALTER TABLE``).
"""

import contextlib

from django.db import migrations, models, transaction


def atomic_ddl(connection):
    """A transaction around DDL where the database can roll DDL back (not MySQL)."""
    if connection.features.can_rollback_ddl:
        return transaction.atomic(using=connection.alias)
    return contextlib.nullcontext()


class AddConstraintThenValidate(migrations.AddConstraint):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        connection = schema_editor.connection
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(connection.alias, model):
            return
        if connection.vendor != "postgresql":
            with atomic_ddl(connection):
                super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        table = schema_editor.quote_name(model._meta.db_table)
        name = schema_editor.quote_name(self.constraint.name)
        schema_editor.execute(f"{self.constraint.create_sql(model, schema_editor)} NOT VALID")
        schema_editor.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        with atomic_ddl(schema_editor.connection):
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("stalwart", "0007_dashboard_cancel_metrics"),
    ]

    operations = [
        AddConstraintThenValidate(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(priority__gte=-100, priority__lte=100),
                name="stalwart_job_priority_range",
            ),
        ),
    ]
