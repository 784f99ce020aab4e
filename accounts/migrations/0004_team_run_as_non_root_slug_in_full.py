"""Team.run_as_non_root: existing teams keep running as they did (False: their images may
run as root, and turning it on would stop those pods at CreateContainerConfigError);
teams created from now on default to True. Slugs are matched in full (\\Z, not $)."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0003_auditentry_ip'),
    ]

    operations = [
        migrations.AddField(  # existing rows: False
            model_name='team',
            name='run_as_non_root',
            field=models.BooleanField(default=False),
        ),
        migrations.AlterField(  # new rows: True
            model_name='team',
            name='run_as_non_root',
            field=models.BooleanField(db_default=True, default=True, help_text="The team's pods run with runAsNonRoot (the image's user must not be root) and its namespace enforces the 'restricted' Pod Security level; otherwise 'baseline'."),
        ),
        migrations.AlterField(
            model_name='serviceaccount',
            name='name',
            field=models.CharField(max_length=40, validators=[django.core.validators.RegexValidator('^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?\\Z', "Use 1-40 lower-case letters, digits or '-', starting and ending with a letter or digit (it becomes part of Kubernetes names).")]),
        ),
        migrations.AlterField(
            model_name='team',
            name='slug',
            field=models.CharField(max_length=40, unique=True, validators=[django.core.validators.RegexValidator('^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?\\Z', "Use 1-40 lower-case letters, digits or '-', starting and ending with a letter or digit (it becomes part of Kubernetes names).")]),
        ),
    ]
