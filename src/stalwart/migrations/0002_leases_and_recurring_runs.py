

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('stalwart', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='Lease',
            fields=[
                ('name', models.CharField(max_length=128, primary_key=True, serialize=False)),
                ('holder', models.CharField(max_length=128)),
                ('acquired_at', models.DateTimeField()),
                ('expires_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'stalwart_lease',
            },
        ),
        migrations.CreateModel(
            name='RecurringRun',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('key', models.CharField(max_length=128)),
                ('run_at', models.DateTimeField()),
                ('job_id', models.UUIDField()),
                ('created_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'stalwart_recurring_run',
                'constraints': [models.UniqueConstraint(fields=('key', 'run_at'), name='stalwart_recurring_run_once')],
            },
        ),
    ]
