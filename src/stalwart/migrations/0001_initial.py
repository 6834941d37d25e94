

from django.db import migrations, models

# The job table churns: every job is inserted, updated twice and deleted. Claims read the head
# of a partial index whose dead entries only vacuum removes, so PostgreSQL should vacuum and
# analyze it after a few hundred changes rather than after 20% of the table.
POSTGRESQL_STORAGE = """
ALTER TABLE stalwart_job SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_vacuum_insert_threshold = 500,
    autovacuum_analyze_scale_factor = 0.01,
    autovacuum_analyze_threshold = 500
)
"""


def tune_storage(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_STORAGE)


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='Job',
            fields=[
                ('id', models.UUIDField(editable=False, primary_key=True, serialize=False)),
                ('task_path', models.CharField(max_length=255)),
                ('backend', models.CharField(default='default', max_length=64)),
                ('queue_name', models.CharField(default='default', max_length=64)),
                ('priority', models.SmallIntegerField(default=0)),
                ('status', models.CharField(choices=[('scheduled', 'Scheduled'), ('blocked', 'Blocked'), ('ready', 'Ready'), ('running', 'Running'), ('successful', 'Successful'), ('failed', 'Failed')], max_length=16)),
                ('args', models.JSONField(default=list)),
                ('kwargs', models.JSONField(default=dict)),
                ('run_after', models.DateTimeField(blank=True, null=True)),
                ('available_at', models.DateTimeField()),
                ('enqueued_at', models.DateTimeField()),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('last_attempted_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('attempt', models.PositiveIntegerField(default=0)),
                ('max_attempts', models.PositiveIntegerField(default=5)),
                ('owner', models.BigIntegerField(blank=True, null=True)),
                ('worker_ids', models.JSONField(default=list)),
                ('errors', models.JSONField(default=list)),
                ('return_value', models.JSONField(blank=True, null=True)),
            ],
            options={
                'db_table': 'stalwart_job',
                'indexes': [models.Index(condition=models.Q(('status', 'ready')), fields=['queue_name', '-priority', 'available_at', 'id'], name='stalwart_job_claim_queue'), models.Index(condition=models.Q(('status', 'ready')), fields=['-priority', 'available_at', 'id'], name='stalwart_job_claim_any'), models.Index(condition=models.Q(('status', 'scheduled')), fields=['available_at'], name='stalwart_job_due'), models.Index(condition=models.Q(('status', 'running')), fields=['owner'], name='stalwart_job_owner'), models.Index(condition=models.Q(('status', 'failed')), fields=['queue_name', 'finished_at'], name='stalwart_job_failed'), models.Index(condition=models.Q(('status__in', ['successful', 'failed'])), fields=['status', 'finished_at'], name='stalwart_job_finished')],
            },
        ),
        migrations.CreateModel(
            name='Process',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('kind', models.CharField(choices=[('supervisor', 'Supervisor'), ('worker', 'Worker'), ('dispatcher', 'Dispatcher'), ('scheduler', 'Scheduler')], max_length=16)),
                ('name', models.CharField(max_length=128, unique=True)),
                ('pid', models.IntegerField()),
                ('hostname', models.CharField(max_length=255)),
                ('supervisor', models.BigIntegerField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
                ('last_heartbeat_at', models.DateTimeField()),
                ('metadata', models.JSONField(default=dict)),
            ],
            options={
                'db_table': 'stalwart_process',
                'indexes': [models.Index(fields=['last_heartbeat_at'], name='stalwart_process_heartbeat'), models.Index(fields=['supervisor'], name='stalwart_process_supervisor')],
            },
        ),
        migrations.RunPython(tune_storage, migrations.RunPython.noop, elidable=True),
    ]
