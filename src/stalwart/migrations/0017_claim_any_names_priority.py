"""The claim-on-every-queue index's condition names the priority (``priority >= -100``, true
of every job), so that only the claim on every queue, which says so, can read it: a claim on
some queues can no longer pick it and filter out the other queues' rows when the statistics
price both indexes at a row (taken when nothing was ready).

MySQL has no partial indexes (0010_mysql_indexes): there the index is rebuilt as 0010 built
it, its condition's columns first. DDL on MySQL commits as it goes, so this is not atomic
there.
"""

from django.db import migrations, models

MYSQL_CLAIM_ANY = "status, isolated, priority DESC, available_at, id"


def mysql_claim_any(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "ALTER TABLE stalwart_job DROP INDEX stalwart_job_claim_any, "
        f"ADD INDEX stalwart_job_claim_any ({MYSQL_CLAIM_ANY})"
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL: the RunPython below is DDL (as 0012_dependencies)

    dependencies = [
        ("stalwart", "0016_batch_members_index"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="job",
            name="stalwart_job_claim_any",
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("priority__gte", -100), ("status", "ready")),
                fields=["-priority", "available_at", "id"],
                name="stalwart_job_claim_any",
            ),
        ),
        # Going back, the plain index Django builds is rebuilt as 0010 built it.
        migrations.RunPython(mysql_claim_any, mysql_claim_any, elidable=False),
    ]
