"""The 10,000-job array's write on PostgreSQL, before and after issue 20's COPY rows
prepared as text from a template encoded once, alternated in one process:

  * before: every row adapted by psycopg (`write_row`), every member's env through
    json.dumps (what services/jobs.py::_copy_array_job did until issue 20, copied here);
  * after: `jobs_submit_bulk`'s own path.

Both in one transaction each, committed (the commit checks the rows' foreign keys: a
fixed share that neither path changes). Database: $FAIRQ_BENCH_BULK_DATABASE_URL, default
.../fairq_bench_bulk, dropped and created afresh. Output: BENCH bulk_copy_{before,after}_s
(wall, median of `--rounds`), bulk_copy_{before,after}_cpu_s (this process's CPU) and
bulk_copy_speedup.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, drop_postgres, note, recreate_postgres  # noqa: E402
from bench_api import setup_django  # noqa: E402

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/fairq_bench_bulk"
COUNT = 10_000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    a = p.parse_args()
    url = os.environ.get("FAIRQ_BENCH_BULK_DATABASE_URL", DEFAULT_PG)
    if not recreate_postgres(url):
        note("skipping: this bench measures PostgreSQL's COPY")
        return 0
    setup_django(url, 1)
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from accounts.models import Team
    from queueing.models import GpuType, Job, JobEvent, Tier
    from queueing.services import jobs

    user = get_user_model().objects.get(username="bench")
    data = jobs.JobInput(team=Team.objects.get(slug="vision"), name="arr",
                         image="ghcr.io/acme/train:1.4", command=["python", "train.py"],
                         args=["--epochs", "1"], env={"SEED": "1"},
                         gpu_type=GpuType.objects.get(slug="h100"), gpus_per_replica=1,
                         replicas=1, tier=Tier.objects.get(slug="normal"),
                         max_runtime_seconds=3600)

    def before() -> None:  # the pre-issue-20 _copy_array_job, as it was
        now = timezone.now()
        template = Job(**data.job_values(), submitter=user, status="QUEUED", created_at=now,
                       updated_at=now)
        event = JobEvent(at=now, kind="transition", from_status="", to_status="QUEUED",
                         actor=user, actor_label=str(user), attempt=1,
                         reason="submitted (array job)")
        names = [f"{data.name}-{i}" for i in range(COUNT)]
        envs = [{**data.env, "FAIRQ_ARRAY_INDEX": str(i), "FAIRQ_ARRAY_SIZE": str(COUNT)}
                for i in range(COUNT)]
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id')) "
                            "FROM generate_series(1, %s)", [Job._meta.db_table, COUNT])
                ids = sorted(r[0] for r in cur.fetchall())
            job_values = jobs._row_values(template)
            columns = ["id", *job_values]
            name_at, env_at = columns.index("name"), columns.index("env")
            base = [None, *job_values.values()]

            def job_rows() -> Any:
                for job_id, name, env in zip(ids, names, envs, strict=True):
                    row = list(base)
                    row[0], row[name_at], row[env_at] = job_id, name, json.dumps(env)
                    yield row

            jobs._copy_rows(Job._meta.db_table, columns, job_rows())
            event_values = jobs._row_values(event)
            event_columns = list(event_values)
            job_at = event_columns.index("job_id")
            event_base = list(event_values.values())

            def event_rows() -> Any:
                for job_id in ids:
                    row = list(event_base)
                    row[job_at] = job_id
                    yield row

            jobs._copy_rows(JobEvent._meta.db_table, event_columns, event_rows())

    def after() -> None:
        jobs.jobs_submit_bulk(actor=user, data=data, count=COUNT)

    sides = {"before": before, "after": after}
    wall: dict[str, list[float]] = {"before": [], "after": []}
    cpu: dict[str, list[float]] = {"before": [], "after": []}
    for fn in sides.values():
        fn()
    for r in range(a.rounds):
        for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
            c0, t0 = time.process_time(), time.perf_counter()
            sides[name]()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    for name in sides:
        bench(f"bulk_copy_{name}_s", statistics.median(wall[name]), "s")
        bench(f"bulk_copy_{name}_cpu_s", statistics.median(cpu[name]), "s")
    bench("bulk_copy_speedup", statistics.median(wall["before"]) / statistics.median(wall["after"]), "x")
    bench("host_load_average_1m", os.getloadavg()[0], "")
    drop_postgres(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
