"""The demo's churn (docs/simulator.md, "The demo").

Question: under `make demo`'s synthetic load, how many preemptions does the real
scheduler cycle make for how many admissions, and how often is one job preempted?

How it works: the demo's settings (`config.settings.demo`: the simulated cluster, its
tiers, teams and quotas from `manage.py seed_demo`), on a fresh SQLite file in /tmp
unless $DATABASE_URL is set (then that database is FLUSHED). `demo_submit_synthetic`
tops up every team's queue every 5 simulated seconds (as the demo's beat task does) and
`scheduler_cycle` runs every 3 simulated seconds, for `--cycles` cycles (400: 20 min);
jobs are stamped with the simulated instant they are submitted at.

Output: `BENCH demo_<metric> <value> <unit>`: admissions, preemptions, the most
preemptions of one job, jobs succeeded and queued at the end.

    .venv/bin/python bench/bench_demo_churn.py [--cycles 400] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import bench, setup_django_sqlite


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.demo"
    # The kept logs of its jobs go to a scratch directory, not the checkout's media/.
    os.environ.setdefault("FAIRQ_LOG_STORAGE_DIR", tempfile.mkdtemp(prefix="fairq-bench-logs-"))
    setup_django_sqlite("fairq_bench_demo_churn")
    from django.core.management import call_command
    from django.db.models import Count
    from django.utils import timezone

    from queueing.models import Job, JobEvent
    from queueing.services.demo import demo_submit_synthetic
    from queueing.services.scheduler import scheduler_cycle

    call_command("flush", interactive=False, verbosity=0)
    call_command("seed_demo", verbosity=0)
    Job.objects.all().delete()
    rng = random.Random(args.seed)
    t0 = timezone.now() + timedelta(seconds=5)
    for i in range(args.cycles):
        now = t0 + timedelta(seconds=3 * i)
        if i % 2 == 0:  # the demo tops up every 5 s; the cycle runs every 3 s
            before = set(Job.objects.values_list("pk", flat=True))
            demo_submit_synthetic(rng=rng)
            Job.objects.exclude(pk__in=before).update(created_at=now)
        scheduler_cycle(now=now)
    preempted = JobEvent.objects.filter(kind=JobEvent.Kind.PREEMPTED)
    top = preempted.values("job_id").annotate(n=Count("id")).order_by("-n").first()
    bench("demo_admissions", JobEvent.objects.filter(
        kind=JobEvent.Kind.TRANSITION, to_status="ADMITTED").count(), "count")
    bench("demo_preemptions", preempted.count(), "count")
    bench("demo_max_preemptions_per_job", top["n"] if top else 0, "count")
    bench("demo_succeeded", Job.objects.filter(status="SUCCEEDED").count(), "count")
    bench("demo_queued_at_end", Job.objects.filter(status="QUEUED").count(), "count")
    return 0


if __name__ == "__main__":
    sys.exit(main())
