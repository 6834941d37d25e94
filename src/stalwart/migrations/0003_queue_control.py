

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('stalwart', '0002_leases_and_recurring_runs'),
    ]

    operations = [
        migrations.CreateModel(
            name='ConcurrencyKey',
            fields=[
                ('key', models.CharField(max_length=255, primary_key=True, serialize=False)),
                ('slot_limit', models.PositiveIntegerField()),
                ('updated_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'stalwart_concurrency_key',
            },
        ),
        migrations.CreateModel(
            name='QueuePause',
            fields=[
                ('queue_name', models.CharField(max_length=64, primary_key=True, serialize=False)),
                ('paused_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'stalwart_queue_pause',
            },
        ),
        migrations.AddField(
            model_name='job',
            name='concurrency_key',
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='unique_key',
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='unique_while_running',
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('status', 'blocked')), fields=['concurrency_key', '-priority', 'available_at', 'id'], name='stalwart_job_blocked'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('concurrency_key__isnull', False), ('status__in', ['ready', 'running'])), fields=['concurrency_key'], name='stalwart_job_slot_holders'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.UniqueConstraint(condition=models.Q(('unique_key__isnull', False), models.Q(('status__in', ['scheduled', 'blocked', 'ready']), models.Q(('status', 'running'), ('unique_while_running', True)), _connector='OR')), fields=('unique_key',), name='stalwart_job_unique_waiting'),
        ),
    ]
