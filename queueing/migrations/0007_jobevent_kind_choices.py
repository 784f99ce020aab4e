"""JobEvent.kind takes the JobEvent.Kind choices: the values stored already, no data
changes; PostgreSQL sees no schema change (choices live in Python only)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('queueing', '0006_tier_grants'),
    ]

    operations = [
        migrations.AlterField(
            model_name='jobevent',
            name='kind',
            field=models.CharField(
                choices=[("transition", "Transition"), ("preempted", "Preempted"),
                         ("preempting", "Preempting"), ("charged", "Charged"),
                         ("waiting", "Waiting"), ("moved", "Moved"),
                         ("pod_restarted", "Pod Restarted"), ("submit_error", "Submit Error")],
                max_length=40),
        ),
    ]
