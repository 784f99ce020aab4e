"""The change feed of job rows the cycle's incremental snapshot reads (PostgreSQL only;
docs/architecture.md, "The incremental snapshot").

`queueing_job.change_xid` is the id of the transaction that last wrote the row: its
default on INSERT (so COPY and bulk inserts need nothing), a trigger on UPDATE (so every
`.update()`, `save()`, raw SQL and admin edit is seen, whoever wrote it). The column is
not a model field: Django never writes it, so no write can set a stale value.
SQLite has no transaction ids: there the cycle reads every active job each time.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

FORWARD = """
ALTER TABLE queueing_job ADD COLUMN change_xid bigint NOT NULL DEFAULT 0;
ALTER TABLE queueing_job ALTER COLUMN change_xid SET DEFAULT txid_current();
CREATE INDEX queueing_job_change_xid_idx ON queueing_job (change_xid);
CREATE FUNCTION queueing_job_change_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.change_xid := txid_current();
    RETURN NEW;
END $$;
CREATE TRIGGER queueing_job_change_xid BEFORE UPDATE ON queueing_job
    FOR EACH ROW EXECUTE FUNCTION queueing_job_change_xid();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS queueing_job_change_xid ON queueing_job;
DROP FUNCTION IF EXISTS queueing_job_change_xid();
DROP INDEX IF EXISTS queueing_job_change_xid_idx;
ALTER TABLE queueing_job DROP COLUMN IF EXISTS change_xid;
"""


def forward(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("queueing", "0017_webhooks_and_job_notify_url")]

    operations = [migrations.RunPython(forward, backward)]
