"""A job waiting for its parents (``pending``) holds its unique key, as a waiting job does:
a unique task can now run after other jobs (``enqueue_after``, ``chain``) and be in a batch.

The unique index on the keys of the jobs that hold them is rebuilt with ``pending`` among its
states: on PostgreSQL and SQLite, the partial unique index ``stalwart_job_unique_waiting``
(``UNIQUE_STATES``); on MySQL and MariaDB, which have no partial indexes (0010_mysql_indexes),
the generated column ``unique_holder`` and its UNIQUE index.

No job can break the new index as it is built: until now a pending job never had a unique
key (a unique task could not wait for parents).

The migration is atomic where DDL is (PostgreSQL, SQLite): the old index is dropped and the
new one built in one transaction, so no enqueue ever finds neither. On MySQL, DDL commits
as it goes; there the column is redefined in place, one ``ALTER TABLE``, with its index.
"""

from django.db import migrations, models

# The generated column: the job's unique key while it holds it, NULL otherwise (as 0010).
MYSQL_UNIQUE_HOLDER = """
ALTER TABLE stalwart_job MODIFY COLUMN unique_holder varchar(64) AS (
    CASE WHEN status IN ({states})
           OR (status = 'running' AND unique_while_running)
         THEN unique_key END
) STORED
"""
HOLDING = "'pending', 'scheduled', 'blocked', 'ready'"
HOLDING_BEFORE = "'scheduled', 'blocked', 'ready'"


def mysql_forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(MYSQL_UNIQUE_HOLDER.format(states=HOLDING))


def mysql_backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(MYSQL_UNIQUE_HOLDER.format(states=HOLDING_BEFORE))


class Migration(migrations.Migration):
    dependencies = [
        ("stalwart", "0017_claim_any_names_priority"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="job",
            name="stalwart_job_unique_waiting",
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    ("unique_key__isnull", False),
                    models.Q(
                        ("status__in", ["pending", "scheduled", "blocked", "ready"]),
                        models.Q(("status", "running"), ("unique_while_running", True)),
                        _connector="OR",
                    ),
                ),
                fields=("unique_key",),
                name="stalwart_job_unique_waiting",
            ),
        ),
        # MySQL: DDL, which commits as it goes (as 0010_mysql_indexes), so not in a
        # transaction of its own there; elsewhere it does nothing.
        migrations.RunPython(mysql_forwards, mysql_backwards, atomic=False, elidable=False),
    ]
