"""Rule K8 (docs/scheduling.md): a disabled cluster drains. `Cluster.drained_at` is when
the scheduler found a disabled cluster with no job left; until then the cycle reads it
for the jobs still there. The clusters disabled before this rule that hold no job are
drained already (under the old rule their jobs were failed): marked so, they are not
read again (a retired cluster's API server may be gone)."""

from django.db import migrations, models
from django.db.models.functions import Now


def mark_empty_disabled_clusters_drained(apps, schema_editor):
    Cluster = apps.get_model("queueing", "Cluster")
    Job = apps.get_model("queueing", "Job")
    holding = Job.objects.filter(status__in=("ADMITTED", "RUNNING"),
                                 cluster_id__isnull=False).values("cluster_id")
    Cluster.objects.filter(enabled=False).exclude(pk__in=holding).update(drained_at=Now())


class Migration(migrations.Migration):

    dependencies = [
        ('queueing', '0023_usage_spot_price'),
    ]

    operations = [
        migrations.AddField(
            model_name='cluster',
            name='drained_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(mark_empty_disabled_clusters_drained, migrations.RunPython.noop),
    ]
