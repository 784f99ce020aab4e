"""Rule T1, tiers allowed per team: Tier.open_to_all_teams and TierGrant.

Existing tiers: a preemptible tier stays open to every team (as before: no pipeline
breaks on upgrade). A non-preemptible tier is closed: its jobs preempt other teams'
(R1) and can never be taken back (R3), which is the harm rule T1 prevents; it is granted to
every team that already has a job of it, so the teams that use it keep using it and the
others are refused. Staff review the grants in the admin (Tiers). New tiers are closed
until staff open or grant them. Slugs are matched in full (\\Z, not $).
"""

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models


def keep_existing_tiers(apps, schema_editor):  # noqa: ANN001, ANN201  (a migration's signature)
    Tier = apps.get_model("queueing", "Tier")
    TierGrant = apps.get_model("queueing", "TierGrant")
    Job = apps.get_model("queueing", "Job")
    Tier.objects.filter(preemptible=True).update(open_to_all_teams=True)
    for tier in Tier.objects.filter(preemptible=False):
        teams = Job.objects.filter(tier=tier).values_list("team_id", flat=True).distinct()
        TierGrant.objects.bulk_create(
            [TierGrant(tier=tier, team_id=team_id) for team_id in teams],
            ignore_conflicts=True)


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0004_team_run_as_non_root_slug_in_full'),
        ('queueing', '0005_tier_priority_class_name_dns1123'),
    ]

    operations = [
        migrations.AddField(
            model_name='tier',
            name='open_to_all_teams',
            field=models.BooleanField(db_default=False, default=False, help_text='Every team may submit jobs of this tier (rule T1); otherwise only the teams granted it below.'),
        ),
        migrations.AlterField(
            model_name='gputype',
            name='slug',
            field=models.CharField(max_length=40, unique=True, validators=[django.core.validators.RegexValidator('^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?\\Z', "Use 1-40 lower-case letters, digits or '-', starting and ending with a letter or digit (it becomes part of Kubernetes names).")]),
        ),
        migrations.AlterField(
            model_name='tier',
            name='slug',
            field=models.CharField(max_length=40, unique=True, validators=[django.core.validators.RegexValidator('^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?\\Z', "Use 1-40 lower-case letters, digits or '-', starting and ending with a letter or digit (it becomes part of Kubernetes names).")]),
        ),
        migrations.CreateModel(
            name='TierGrant',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('team', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='tier_grants', to='accounts.team')),
                ('tier', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='grants', to='queueing.tier')),
            ],
            options={
                'ordering': ['tier__rank', 'team__slug'],
                'constraints': [models.UniqueConstraint(fields=('tier', 'team'), name='one_grant_per_tier_team')],
            },
        ),
        migrations.RunPython(keep_existing_tiers, migrations.RunPython.noop),
    ]
