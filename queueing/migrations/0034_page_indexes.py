"""Indexes of the pages' reads with 1,000,000 jobs (docs/performance.md, "A fleet of 5,000
nodes: pages with 1,000,000 jobs"):

  * `job_team_id_idx` (team, id): a team's jobs newest first (the job list's keyset pages,
    the dashboard's recent jobs) read as one ordered index range, not a backward walk
    of every team's jobs;
  * `job_team_status_id_idx` (team, status, id), in place of (team, status): the same
    reads by status (the job list filtered, the team's queued and running jobs), in order;
  * `jobevent_preempted_at_idx` (at) of the "preempted" events only: a team's recent
    preemptions on the dashboard, without walking every event of the last day;
  * `usage_priced_start_idx` (start) of the usage records on spot nodes or with a price
    of their own (rule C4): the reports page reads those again, a few among every record.

Built CONCURRENTLY on PostgreSQL (the job table takes writes while they build), plainly
elsewhere. `PAGE_INDEXES` names them for bench/bench_dashboard.py, which times the pages
with and without them."""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

PAGE_INDEXES = ("job_team_id_idx", "job_team_status_id_idx", "jobevent_preempted_at_idx",
                "usage_priced_start_idx")


class _Online:
    """CONCURRENTLY on PostgreSQL; the plain operation on other databases (SQLite)."""

    plain: type

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        return self.plain.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        return self.plain.database_backwards(self, app_label, schema_editor, from_state, to_state)


class AddIndexOnline(_Online, AddIndexConcurrently):
    plain = migrations.AddIndex


class RemoveIndexOnline(_Online, RemoveIndexConcurrently):
    plain = migrations.RemoveIndex


class Migration(migrations.Migration):

    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ('queueing', '0033_reservations'),
    ]

    operations = [
        AddIndexOnline(
            model_name='job',
            index=models.Index(fields=['team', 'id'], name='job_team_id_idx'),
        ),
        AddIndexOnline(
            model_name='job',
            index=models.Index(fields=['team', 'status', 'id'], name='job_team_status_id_idx'),
        ),
        RemoveIndexOnline(
            model_name='job',
            name='job_team_status_idx',
        ),
        AddIndexOnline(
            model_name='jobevent',
            index=models.Index(condition=models.Q(('kind', 'preempted')), fields=['at'],
                               name='jobevent_preempted_at_idx'),
        ),
        AddIndexOnline(
            model_name='usagerecord',
            index=models.Index(condition=models.Q(('spot', True),
                                                  ('price_per_gpu_hour__isnull', False),
                                                  _connector='OR'),
                               fields=['start'], name='usage_priced_start_idx'),
        ),
    ]
