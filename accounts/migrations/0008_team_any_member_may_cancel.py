from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0007_team_allowed_notify_url_prefixes'),
    ]

    operations = [
        migrations.AddField(
            model_name='team',
            name='any_member_may_cancel',
            field=models.BooleanField(db_default=False, default=False, help_text="Every member may cancel any job of the team; off: only the job's submitter, the team's admins and staff may."),
        ),
    ]
