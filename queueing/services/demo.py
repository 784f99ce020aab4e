"""Demo data and synthetic load for `make demo` (never used in production settings)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_CEILING, Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from accounts.models import Membership, Role, ServiceAccount, Team
from accounts.services import service_account_create
from queueing.models import (
    UTIL_HIST_BINS,
    AttemptUtilization,
    Cluster,
    GpuPrice,
    GpuType,
    Job,
    JobEvent,
    NodePool,
    Quota,
    Tier,
    TierGrant,
    UsageRecord,
    UtilizationSample,
)
from queueing.policy.idle import percentile_from_histogram
from queueing.policy.states import JobState
from queueing.selectors.costs import cost_buckets, month_range

from .costs import gpu_price_set, team_budget_set
from .fairshare import fairshare_snapshot_take
from .jobs import JobInput, job_submit
from .sessions import session_start
from .usage import accumulator_add

DEMO_PASSWORD = "fairq-demo"

RACK = [{"name": "rack", "node_label": "topology.kubernetes.io/rack"}]
GPU_TYPES: list[tuple[str, str, str, dict[str, str], float, list[dict[str, str]]]] = [
    # slug, name, resource, labels, billing weight, topology levels (rule A7; the demo's
    # simulated h100 nodes come in racks: config/settings/demo.py)
    ("h100", "NVIDIA H100 80GB", "nvidia.com/gpu",
     {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, 2.0, RACK),
    ("a100", "NVIDIA A100 40GB", "nvidia.com/gpu",
     {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}, 1.0, []),
    ("mig-1g-10gb", "A100 MIG 1g.10gb slice", "nvidia.com/mig-1g.10gb",
     {"nvidia.com/mig.config": "all-1g.10gb"}, 0.15, []),
    ("t4-shared", "NVIDIA T4, time-sliced 4 ways", "nvidia.com/gpu.shared",
     {"nvidia.com/gpu.product": "Tesla-T4-SHARED"}, 0.25, []),
]
# Shared GPUs (docs/api.md, "Fractions of a GPU"): the demo's time-sliced pool, 4 slices
# per T4 (the device plugin's replicas, renamed nvidia.com/gpu.shared); every other type
# is exclusive.
GPU_SHARING = {"t4-shared": ("time-sliced", 4)}
TIERS = [
    # slug, name, rank, priority class, value, preemptible, min runtime, open to all teams
    ("critical", "Critical (never preempted)", 300, "fairq-critical", 100000, False, 0, False),
    ("high", "High", 200, "fairq-high", 10000, True, 600, True),
    ("normal", "Normal", 100, "fairq-normal", 1000, True, 300, True),
    ("low", "Low (preemptible, scavenger)", 0, "fairq-low", 100, True, 0, True),
]
# Rules U1-U3 per tier: (SM-activity threshold %, window minutes, action, grace minutes):
# low jobs idle for 10 minutes are requeued 5 minutes later; the others only flagged.
TIER_IDLE = {"critical": (5.0, 30, "flag", 10), "high": (5.0, 10, "flag", 10),
             "normal": (5.0, 10, "flag", 10), "low": (5.0, 10, "requeue", 5)}
# The names of its namespace a team's jobs may use (docs/api.md, "Volumes, secrets and
# metadata"): what examples/torchrun-job.yaml names, so it validates against the demo.
TEAM_ALLOWLISTS = {"vision": {"allowed_pvcs": ["imagenet", "vision-checkpoints",
                                               "vision-notebooks"],
                              "allowed_secrets": ["hf-token", "wandb"],
                              "allowed_pull_secrets": ["regcred"]}}
# Rule T1: the closed tiers and the teams they are granted to.
TIER_GRANTS = {"critical": ["nlp"]}
TEAMS: list[tuple[str, str, float, dict[str, tuple[int, int | None]], list[tuple[str, Role]]]] = [
    # slug, name, weight, quotas {gpu: (nominal, borrowing limit)}, people
    ("vision", "Computer Vision", 3.0, {"h100": (12, 8), "a100": (8, 8), "t4-shared": (2, 2)},
     [("alice", Role.TEAM_ADMIN), ("dave", Role.MEMBER)]),
    ("nlp", "Language Models", 2.0, {"h100": (12, 12), "a100": (12, 8),
                                     "t4-shared": (2, None)},
     [("bob", Role.TEAM_ADMIN)]),
    ("speech", "Speech", 1.0, {"h100": (4, 4), "a100": (8, None), "mig-1g-10gb": (7, 7)},
     [("carol", Role.TEAM_ADMIN), ("dave", Role.MEMBER)]),
    ("recsys", "Recommendations", 1.0, {"a100": (4, 12), "mig-1g-10gb": (7, None)},
     [("erin", Role.TEAM_ADMIN)]),
]

# Quotas in a tree (docs/scheduling.md, "Quotas in a tree: what admins write and see"):
# a department over two of the teams, its h100 quota their 12 + 12 and a pool of 8 they
# share, borrowing at most 16 more from the fleet. Its weight is its teams' (rule F4: a
# department's share is split among its teams by their weights), so the standings keep
# the flat demo's shares.
DEPARTMENTS: list[tuple[str, str, float, dict[str, tuple[int, int | None]], list[str]]] = [
    # slug, name, weight, quotas {gpu: (nominal, borrowing limit)}, its teams
    ("research", "Research", 5.0, {"h100": (32, 16)}, ["vision", "nlp"]),
]


# The demo's three simulated clusters (docs/clusters.md): name, cost rank (rule K2: the
# lowest first), labels (rule K3's selectors), nodes (FAIRQ_SIM_NODES' grammar), spot
# pools (rule K4: GPU type, price per GPU-hour).
CLUSTERS: list[tuple[str, int, dict[str, str], str, list[tuple[str, str]]]] = [
    ("onprem", 0, {"site": "onprem", "region": "eu-west"},
     "4x8xh100@rack=2,2x8xa100,2x7xmig-1g-10gb,2x4xt4-shared", []),
    ("cloud-spot", 5, {"site": "cloud", "region": "eu-west", "capacity": "spot"},
     "4x8xa100:spot", [("a100", "0.9000")]),
    ("cloud", 10, {"site": "cloud", "region": "us-east", "capacity": "on-demand"},
     "2x8xh100,2x8xa100", []),
]


@transaction.atomic
def demo_clusters_seed() -> list[Cluster]:
    """The demo's clusters as `Cluster` rows (with their spot pools), brought back to
    shape when they exist: one on-premises, a spot pool in the cloud, on-demand cloud."""
    out = []
    for name, rank, labels, nodes, spot in CLUSTERS:
        cluster, _ = Cluster.objects.update_or_create(name=name, defaults={
            "backend": "simulated", "sim_nodes": nodes, "cost_rank": rank, "labels": labels,
            "enabled": True})
        for gpu, price in spot:
            NodePool.objects.update_or_create(cluster=cluster, name=f"{gpu}-spot", defaults={
                "gpu_type": GpuType.objects.get(slug=gpu), "spot": True,
                "price_per_gpu_hour": price})
        out.append(cluster)
    return out


@dataclass(frozen=True)
class DemoLogin:
    username: str
    password: str
    teams: str


@transaction.atomic
def demo_seed() -> list[DemoLogin]:
    """Create (or bring back to shape) the demo teams, users, GPU types, tiers, quotas.
    Running it twice changes nothing the second time."""
    user_model = get_user_model()
    for slug, name, resource, labels, weight, levels in GPU_TYPES:
        sharing, slices = GPU_SHARING.get(slug, ("exclusive", 1))
        GpuType.objects.update_or_create(slug=slug, defaults={
            "name": name, "resource_name": resource, "node_labels": labels,
            "billing_weight": weight, "topology_levels": levels,
            "sharing": sharing, "slices_per_gpu": slices})
    for slug, name, rank, pc, value, preemptible, min_rt, open_to_all in TIERS:
        Tier.objects.update_or_create(slug=slug, defaults={
            "name": name, "rank": rank, "priority_class_name": pc, "priority_value": value,
            "preemptible": preemptible, "min_runtime_seconds": min_rt,
            "open_to_all_teams": open_to_all,
            **dict(zip(("idle_threshold_percent", "idle_window_minutes", "idle_action",
                        "idle_grace_minutes"), TIER_IDLE[slug], strict=True))})
    logins: dict[str, list[str]] = {}
    admin, created = user_model.objects.get_or_create(
        username="admin", defaults={"is_staff": True, "is_superuser": True})
    if created:
        admin.set_password(DEMO_PASSWORD)
        admin.save()
    logins["admin"] = ["staff"]
    for slug, name, weight, quotas, people in TEAMS:
        team, _ = Team.objects.update_or_create(slug=slug, defaults={
            "name": name, "weight": weight, **TEAM_ALLOWLISTS.get(slug, {})})
        for gpu, (nominal, borrow) in quotas.items():
            Quota.objects.update_or_create(
                team=team, gpu_type=GpuType.objects.get(slug=gpu),
                defaults={"nominal": nominal, "borrowing_limit": borrow})
        for username, role in people:
            user, created = user_model.objects.get_or_create(username=username)
            if created:
                user.set_password(DEMO_PASSWORD)
                user.save()
            Membership.objects.update_or_create(user=user, team=team, defaults={"role": role})
            logins.setdefault(username, []).append(f"{slug} ({role})")
        if not ServiceAccount.objects.filter(team=team, name="pipeline").exists():
            service_account_create(team=team, name="pipeline")
    _demo_departments()
    for tier_slug, team_slugs in TIER_GRANTS.items():
        for team_slug in team_slugs:
            TierGrant.objects.get_or_create(tier=Tier.objects.get(slug=tier_slug),
                                            team=Team.objects.get(slug=team_slug))
    return [DemoLogin(u, DEMO_PASSWORD, ", ".join(t)) for u, t in logins.items()]


def _demo_departments() -> None:
    """`DEPARTMENTS`: each a team with its teams under it and its own quota rows, which
    hold its teams' nominals (rule Q8)."""
    for slug, name, weight, quotas, teams in DEPARTMENTS:
        dept, _ = Team.objects.update_or_create(slug=slug, defaults={"name": name,
                                                                     "weight": weight})
        Team.objects.filter(slug__in=teams).update(parent=dept)
        for gpu, (nominal, borrow) in quotas.items():
            Quota.objects.update_or_create(
                team=dept, gpu_type=GpuType.objects.get(slug=gpu),
                defaults={"nominal": nominal, "borrowing_limit": borrow})


# The demo's past (demo_history_seed): GPUs a team typically held at once per GPU type,
# so the standings differ from the start (vision and nlp busy, speech and recsys less).
HISTORY_LOAD = {"vision": {"h100": 12, "a100": 6}, "nlp": {"h100": 14, "a100": 4},
                "speech": {"a100": 4, "mig-1g-10gb": 5}, "recsys": {"a100": 3}}
HISTORY_SNAPSHOT_HOURS = 2
# How busy a team's GPUs were (rule U5's SM activity): the mean of its busy minutes and
# the share of minutes below 5% (paid but idle, rule C3), so the reports' used, idle and
# efficiency columns differ by team.
HISTORY_ACTIVITY = {"vision": (82.0, 0.04), "nlp": (74.0, 0.08), "speech": (61.0, 0.15),
                    "recsys": (48.0, 0.30)}
HISTORY_GPU_MEMORY = {"h100": 80 << 30, "a100": 40 << 30, "mig-1g-10gb": 10 << 30}
# Rule C1's list prices per GPU-hour (FAIRQ_CURRENCY, EUR by default), from the first day
# of the month the history starts in; set only for a type that has no price yet.
DEMO_GPU_PRICES = {"h100": Decimal("3.20"), "a100": Decimal("1.60"),
                   "mig-1g-10gb": Decimal("0.25"), "t4-shared": Decimal("0.40")}
# Rule B1's monthly budgets (set only for a team that has none): vision's a fixed amount,
# nlp's what makes its cost this month 85% of it (rule B2's 80% warning shows).
DEMO_BUDGETS: dict[str, tuple[Decimal | float, str]] = {
    "vision": (Decimal("12000"), "none"), "nlp": (0.85, "downgrade")}


@dataclass(frozen=True)
class DemoHistory:
    jobs: int  # finished jobs written (each one charged attempt, a usage record)
    prices: int  # GPU prices set
    budgets: int  # team budgets set


def demo_history_seed(*, now: datetime, days: int = 4, seed: int = 17) -> DemoHistory:
    """A few days of past GPU usage for the demo teams, so the usage chart and the
    reports mean something at once: finished jobs of each team's `pipeline` service
    account, each with its events, its charged attempt (a usage record: rule F1's
    accumulators move with it) and its GPUs' per-minute SM activity and summary (rule
    U5: used and idle GPU-hours, rule C3); the standings snapshots of those days (every
    HISTORY_SNAPSHOT_HOURS, as they were then); list prices for the GPU types (rule C1)
    and two team budgets (rule B1). The usage part does nothing when any usage is
    recorded already (a second `seed_demo`, or a demo that ran); prices and budgets are
    set where there are none."""
    jobs = 0
    if not UsageRecord.objects.exists():
        start = (now - timedelta(days=days)).replace(minute=0, second=0, microsecond=0)
        jobs = _history_jobs(start=start, now=now, rng=random.Random(seed))
        at = start + timedelta(hours=HISTORY_SNAPSHOT_HOURS)
        while at < now:
            fairshare_snapshot_take(now=now, at=at)
            at += timedelta(hours=HISTORY_SNAPSHOT_HOURS)
    first = UsageRecord.objects.order_by("start").values_list("start", flat=True).first()
    prices = _demo_prices(since=(first or now).astimezone(UTC).date().replace(day=1))
    return DemoHistory(jobs=jobs, prices=prices, budgets=_demo_budgets(now=now))


def _history_runs(*, start: datetime, now: datetime, rng: random.Random, known: set[str]
                  ) -> list[tuple[str, str, int, datetime, datetime]]:
    """(team, GPU type, GPUs, start, end) of the past runs, one after another per team
    and type with idle gaps between, all ended by half an hour before `now` (the last
    one cut there)."""
    runs = []
    for team, load in HISTORY_LOAD.items():
        for gpu, typical in load.items():
            if gpu not in known:
                continue
            t = start + timedelta(minutes=rng.randint(0, 180))
            while True:
                hours = rng.uniform(1.0, 7.0)
                end = min(t + timedelta(hours=hours), now - timedelta(minutes=30))
                if end - t < timedelta(minutes=20):
                    break
                gpus = max(1, round(typical * rng.uniform(0.4, 1.4)))
                runs.append((team, gpu, gpus, t.replace(second=0, microsecond=0),
                             end.replace(second=0, microsecond=0)))
                if end == now - timedelta(minutes=30):
                    break  # the last run, cut short
                t = end + timedelta(hours=rng.uniform(0.5, 6.0))  # idle between runs
    return runs


def _activity(*, minutes: int, busy_mean: float, idle_share: float,
              rng: random.Random) -> list[float]:
    """A run's SM activity per minute: busy minutes around `busy_mean`, `idle_share` of
    them below 5% in short spells (never 10 in a row: no run was idle for its tier's
    window, rule U2)."""
    out: list[float] = []
    spell = 0
    for _ in range(minutes):
        if spell < 9 and rng.random() < idle_share:
            spell += 1
            out.append(round(rng.uniform(0.0, 4.5), 1))
        else:
            spell = 0
            out.append(round(min(100.0, max(5.0, rng.gauss(busy_mean, 9.0))), 1))
    return out


@transaction.atomic
def _history_jobs(*, start: datetime, now: datetime, rng: random.Random) -> int:
    gpu_types = {g.slug: g for g in GpuType.objects.all()}
    accounts = {sa.team.slug: sa for sa in ServiceAccount.objects.select_related(
        "team", "user").filter(name="pipeline")}
    tiers = {t.slug: t for t in Tier.objects.filter(slug__in=["normal", "low"])}
    cluster = Cluster.objects.filter(name="onprem").first()
    runs = [r for r in _history_runs(start=start, now=now, rng=rng, known=set(gpu_types))
            if r[0] in accounts]
    samples: list[UtilizationSample] = []
    summaries: list[AttemptUtilization] = []
    events: list[JobEvent] = []
    for n, (team, gpu, gpus, r_start, r_end) in enumerate(sorted(runs, key=lambda r: r[3])):
        sa, gpu_type = accounts[team], gpu_types[gpu]
        replicas = -(-gpus // 8)
        per = -(-gpus // replicas)
        gpus = per * replicas
        queued = r_start - timedelta(minutes=rng.randint(1, 40))
        admitted = r_start - timedelta(seconds=rng.randint(5, 40))
        failed = rng.random() < 0.08
        tier = tiers["low" if rng.random() < 0.25 else "normal"]
        job = Job.objects.create(
            team=sa.team, submitter=sa.user, name=f"{team}-{rng.choice(['train', 'sweep', 'ft'])}"
            f"-{n:04d}", image="ghcr.io/acme/train:1.4", command=["python", "train.py"],
            args=[], env={}, gpu_type=gpu_type, gpus_per_replica=per, replicas=replicas,
            tier=tier, max_runtime_seconds=8 * 3600, created_at=queued, admitted_at=admitted,
            started_at=r_start, finished_at=r_end, cluster=cluster,
            status=JobState.FAILED if failed else JobState.SUCCEEDED,
            exit_code=1 if failed else 0, message="exit code 1" if failed else "")
        ended = JobState.FAILED if failed else JobState.SUCCEEDED
        for at, src, dst, reason, actor in (
                (queued, "", JobState.QUEUED, "submitted", sa.user),
                (admitted, JobState.QUEUED, JobState.ADMITTED, "admitted", None),
                (r_start, JobState.ADMITTED, JobState.RUNNING, "running", None),
                (r_end, JobState.RUNNING, ended, "exit code 1" if failed else "succeeded",
                 None)):
            events.append(JobEvent(job=job, at=at, kind=JobEvent.Kind.TRANSITION,
                                   from_status=src, to_status=dst, actor=actor,
                                   actor_label=str(sa.user) if actor else "scheduler",
                                   reason=reason, attempt=1))
        UsageRecord.objects.create(
            team=sa.team, gpu_type=gpu_type, job=job, attempt=1, gpus=gpus,
            billing_weight=gpu_type.billing_weight, start=r_start, end=r_end,
            gpu_seconds=gpus * (r_end - r_start).total_seconds(), cluster=cluster)
        accumulator_add(team_id=sa.team_id, rate=gpus * gpu_type.billing_weight,
                        start=r_start, end=r_end)  # as usage_record_attempt does (rule F1)
        minutes = int((r_end - r_start).total_seconds() // 60)
        busy, idle = HISTORY_ACTIVITY.get(team, (70.0, 0.1))
        sm = _activity(minutes=minutes, busy_mean=busy, idle_share=idle, rng=rng)
        mem = [round(gpus * HISTORY_GPU_MEMORY.get(gpu, 40 << 30) * min(0.95, v / 100 + 0.3))
               for v in sm]
        hist: dict[str, int] = {}
        for v in sm:
            key = str(min(UTIL_HIST_BINS - 1, int(v)))
            hist[key] = hist.get(key, 0) + 1
        samples += [UtilizationSample(job=job, attempt=1, minute=r_start + timedelta(minutes=i),
                                      sm=v, mem_bytes=m)
                    for i, (v, m) in enumerate(zip(sm, mem, strict=True))]
        summaries.append(AttemptUtilization(
            job=job, attempt=1, first_at=r_start,
            last_at=r_start + timedelta(minutes=minutes - 1), samples=minutes,
            sm_sum=sum(sm), mem_sum=float(sum(mem)), sm_hist=hist, sm_last=sm[-1],
            sm_mean=sum(sm) / minutes, sm_p95=percentile_from_histogram(hist, 0.95),
            mem_last_bytes=mem[-1], mem_mean_bytes=round(sum(mem) / minutes),
            mem_max_bytes=max(mem)))
    JobEvent.objects.bulk_create(events, batch_size=2000)
    AttemptUtilization.objects.bulk_create(summaries, batch_size=2000)
    UtilizationSample.objects.bulk_create(samples, batch_size=5000)
    return len(runs)


def _demo_admin() -> Any:
    return get_user_model().objects.get(username="admin")


def _demo_prices(*, since: date) -> int:
    """Rule C1: the demo's list prices from `since`, for the types without a price."""
    priced = set(GpuPrice.objects.values_list("gpu_type__slug", flat=True))
    n = 0
    for gpu_type in GpuType.objects.filter(slug__in=DEMO_GPU_PRICES).exclude(slug__in=priced):
        gpu_price_set(actor=_demo_admin(), gpu_type=gpu_type, effective_from=since,
                      price_per_gpu_hour=DEMO_GPU_PRICES[gpu_type.slug])
        n += 1
    return n


def _demo_budgets(*, now: datetime) -> int:
    """Rule B1: the demo's budgets, for the teams without one. A float is the share of
    the budget the team's cost this month should be (its budget is that cost / share,
    rounded up to 100; at least 100)."""
    n = 0
    for team in Team.objects.filter(slug__in=DEMO_BUDGETS, budget__isnull=True):
        amount, policy = DEMO_BUDGETS[team.slug]
        if isinstance(amount, float):
            month, _ = month_range(now.astimezone(UTC).date())
            cost = sum((b.cost for b in cost_buckets(teams=[team], start=month, end=now,
                                                     period="month", now=now)), Decimal(0))
            amount = max(Decimal(100), (cost / Decimal(repr(amount)) / 100).to_integral_value(
                rounding=ROUND_CEILING) * 100)
        team_budget_set(actor=_demo_admin(), team=team, monthly_amount=amount, policy=policy)
        n += 1
    return n


def demo_submit_synthetic(*, rng: random.Random, per_team_queue: int = 4) -> int:
    """Top up each demo team's queue to `per_team_queue` jobs of random shape."""
    submitted = 0
    tiers = {t.slug: t for t in Tier.objects.all()}
    gpu_types = {g.slug: g for g in GpuType.objects.all()}
    for sa in ServiceAccount.objects.select_related("team", "user").filter(name="pipeline"):
        team = sa.team
        waiting = Job.objects.filter(team=team, status=JobState.QUEUED).count()
        quotas = list(Quota.objects.filter(team=team).values_list("gpu_type__slug", flat=True))
        for _ in range(max(0, per_team_queue - waiting)):
            gpu = rng.choice(quotas) if quotas else "a100"
            size = 7 if gpu.startswith("mig") else 8
            # A time-sliced type: mostly fractions of one GPU (a notebook, a small eval).
            slices = rng.choice([1, 1, 2, 2, 3, 0]) if gpu_types[gpu].packs_slices else 0
            tier = rng.choices(["low", "normal", "high"], weights=[2, 6, 1])[0]
            env = {"FAIRQ_SIM_SECONDS": str(rng.randint(15, 90))}
            # The GPUs' SM activity the simulated cluster reports (rules U1-U5): mostly
            # busy, some jobs that go idle (and run long enough to be flagged), some
            # that report nothing.
            kind = rng.choices(["busy", "idle", "none"], weights=[6, 1, 1])[0]
            if kind == "busy":
                env["FAIRQ_SIM_GPU_UTIL"] = ",".join(
                    str(rng.randint(55, 98)) for _ in range(rng.randint(1, 5)))
            elif kind == "idle":
                env = {"FAIRQ_SIM_SECONDS": str(rng.randint(1200, 2400)),
                       "FAIRQ_SIM_GPU_UTIL": f"{rng.randint(60, 95)},{rng.randint(20, 50)},"
                                             f"{rng.randint(0, 4)}"}
            job_submit(actor=sa.user, data=JobInput(
                team=team, name=f"{team.slug}-{rng.choice(['train', 'eval', 'sweep', 'ft'])}"
                f"-{rng.randrange(10_000):04d}",
                image="ghcr.io/acme/train:1.4", command=["python", "train.py"], args=[],
                env=env, gpu_type=gpu_types[gpu],
                gpus_per_replica=1 if gpu_types[gpu].packs_slices else rng.choice([1, 2, 4, size]),
                replicas=1 if slices else rng.choices([1, 2], weights=[5, 1])[0],
                tier=tiers[tier], max_runtime_seconds=3600, gpu_slices=slices,
            ))
            submitted += 1
    return submitted


# The demo's notebook session (docs/sessions.md, "In the demo"): dave's, in vision, its
# files on the PVC vision-notebooks (a directory of FAIRQ_SIM_NOTEBOOK_DIR).
DEMO_SESSION = {"user": "dave", "team": "vision", "name": "dave-notebook",
                "pvc": "vision-notebooks"}


def demo_session_seed(*, now: datetime) -> int | None:
    """Start one notebook session for the demo's dave unless he has one that has not
    ended: the id of the session started, None when there was one. It queues like any
    session; the demo's worker runs it (with JupyterLab installed, a real local server
    dave opens from "My sessions")."""
    from queueing.models import NotebookSession
    from queueing.policy.states import FINAL_STATES

    user = get_user_model().objects.get(username=DEMO_SESSION["user"])
    if NotebookSession.objects.filter(owner=user).exclude(
            job__status__in=[s.value for s in FINAL_STATES]).exists():
        return None
    job = session_start(actor=user, team=DEMO_SESSION["team"], name=DEMO_SESSION["name"],
                        pvc=DEMO_SESSION["pvc"], now=now)
    return job.pk


DEMO_BOOKING = {"user": "alice", "team": "vision", "gpu_type": "h100", "name": "weekly eval",
                "recurrence": "FREQ=WEEKLY;COUNT=12"}
DEMO_BOOKING_GPUS, DEMO_BOOKING_HOURS = 8, 2


def demo_reservation_seed(*, now: datetime) -> int | None:
    """Book the demo's weekly window (docs/reservations.md) for alice's vision unless a
    live one of that name exists: 8 h100 from the next whole hour + 1 h, 2 h, weekly,
    lent when unused. The id booked; None when there was one or it could not be
    guaranteed (the demo goes on without it)."""
    from queueing.errors import DomainError
    from queueing.models import Reservation

    from .reservations import BookingAsk, reservation_book

    spec = DEMO_BOOKING
    if Reservation.objects.filter(name=spec["name"], cancelled_at__isnull=True).exists():
        return None
    start = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=2)
    try:
        row = reservation_book(
            actor=get_user_model().objects.get(username=spec["user"]), now=now,
            ask=BookingAsk(team=Team.objects.get(slug=spec["team"]),
                           gpu_type=GpuType.objects.get(slug=spec["gpu_type"]),
                           gpus=DEMO_BOOKING_GPUS, starts_at=start,
                           ends_at=start + timedelta(hours=DEMO_BOOKING_HOURS),
                           recurrence=spec["recurrence"], name=spec["name"]))
    except DomainError:
        return None
    return row.pk
