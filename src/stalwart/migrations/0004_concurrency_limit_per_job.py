

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('stalwart', '0003_queue_control'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='concurrency_limit',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
