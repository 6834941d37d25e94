"""An index of the jobs that others run after, by when they finished: the dispatcher's look
at the dependants of jobs finished since its last look reads these alone.

MySQL has no partial indexes (0010_mysql_indexes): there the index leads with its
condition's column instead. DDL on MySQL commits as it goes, so this is not atomic there.
"""

from django.db import migrations, models


def mysql_parents_index(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "ALTER TABLE stalwart_job DROP INDEX stalwart_job_parents, "
        "ADD INDEX stalwart_job_parents (has_dependants, finished_at)"
    )


def mysql_plain_index(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "ALTER TABLE stalwart_job DROP INDEX stalwart_job_parents, "
        "ADD INDEX stalwart_job_parents (finished_at)"
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL: the RunPython below is DDL (as 0012_dependencies)

    dependencies = [
        ("stalwart", "0014_has_dependants"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("has_dependants", True)),
                fields=["finished_at"],
                name="stalwart_job_parents",
            ),
        ),
        migrations.RunPython(mysql_parents_index, mysql_plain_index, elidable=False),
    ]
