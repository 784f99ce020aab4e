"""Demo data and synthetic load for `make demo` (never used in production settings)."""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import transaction

from accounts.models import Membership, Role, ServiceAccount, Team
from accounts.services import service_account_create
from queueing.models import (
    Cluster,
    GpuType,
    Job,
    NodePool,
    Quota,
    Tier,
    TierGrant,
    UsageRecord,
)
from queueing.policy.states import JobState

from .fairshare import fairshare_snapshot_take
from .jobs import JobInput, job_submit
from .usage import usage_import_csv

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
]
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
TEAM_ALLOWLISTS = {"vision": {"allowed_pvcs": ["imagenet", "vision-checkpoints"],
                              "allowed_secrets": ["hf-token", "wandb"],
                              "allowed_pull_secrets": ["regcred"]}}
# Rule T1: the closed tiers and the teams they are granted to.
TIER_GRANTS = {"critical": ["nlp"]}
TEAMS: list[tuple[str, str, float, dict[str, tuple[int, int | None]], list[tuple[str, Role]]]] = [
    # slug, name, weight, quotas {gpu: (nominal, borrowing limit)}, people
    ("vision", "Computer Vision", 3.0, {"h100": (12, 8), "a100": (8, 8)},
     [("alice", Role.TEAM_ADMIN), ("dave", Role.MEMBER)]),
    ("nlp", "Language Models", 2.0, {"h100": (12, 12), "a100": (12, 8)},
     [("bob", Role.TEAM_ADMIN)]),
    ("speech", "Speech", 1.0, {"h100": (4, 4), "a100": (8, None), "mig-1g-10gb": (7, 7)},
     [("carol", Role.TEAM_ADMIN), ("dave", Role.MEMBER)]),
    ("recsys", "Recommendations", 1.0, {"a100": (4, 12), "mig-1g-10gb": (7, None)},
     [("erin", Role.TEAM_ADMIN)]),
]


# The demo's three simulated clusters (docs/clusters.md): name, cost rank (rule K2: the
# lowest first), labels (rule K3's selectors), nodes (FAIRQ_SIM_NODES' grammar), spot
# pools (rule K4: GPU type, price per GPU-hour).
CLUSTERS: list[tuple[str, int, dict[str, str], str, list[tuple[str, str]]]] = [
    ("onprem", 0, {"site": "onprem", "region": "eu-west"},
     "4x8xh100@rack=2,2x8xa100,2x7xmig-1g-10gb", []),
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
        GpuType.objects.update_or_create(slug=slug, defaults={
            "name": name, "resource_name": resource, "node_labels": labels,
            "billing_weight": weight, "topology_levels": levels})
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
    for tier_slug, team_slugs in TIER_GRANTS.items():
        for team_slug in team_slugs:
            TierGrant.objects.get_or_create(tier=Tier.objects.get(slug=tier_slug),
                                            team=Team.objects.get(slug=team_slug))
    return [DemoLogin(u, DEMO_PASSWORD, ", ".join(t)) for u, t in logins.items()]


# The demo's past (demo_history_seed): GPUs a team typically held at once per GPU type,
# so the standings differ from the start (vision and nlp busy, speech and recsys less).
HISTORY_LOAD = {"vision": {"h100": 12, "a100": 6}, "nlp": {"h100": 14, "a100": 4},
                "speech": {"a100": 4, "mig-1g-10gb": 5}, "recsys": {"a100": 3}}
HISTORY_SNAPSHOT_HOURS = 2


def demo_history_seed(*, now: datetime, days: int = 4, seed: int = 17) -> int:
    """A few days of past GPU usage for the demo teams, so the usage chart and the
    reports mean something at once: imported like another scheduler's history
    (`usage_import_csv`: rule F1's accumulators move with it) and the standings snapshots
    of those days (every HISTORY_SNAPSHOT_HOURS, as they were then). Does nothing when
    any usage is recorded already (a second `seed_demo`, or a demo that ran). Returns the
    number of usage rows imported."""
    if UsageRecord.objects.exists():
        return 0
    rng = random.Random(seed)
    known = set(GpuType.objects.values_list("slug", flat=True))
    start = (now - timedelta(days=days)).replace(minute=0, second=0, microsecond=0)
    lines = ["team,gpu_type,gpus,start,end"]
    for team, load in HISTORY_LOAD.items():
        for gpu, typical in load.items():
            if gpu not in known:
                continue
            t = start + timedelta(minutes=rng.randint(0, 180))
            while True:
                hours = rng.uniform(1.0, 7.0)
                end = t + timedelta(hours=hours)
                if end > now - timedelta(minutes=30):
                    break
                gpus = max(1, round(typical * rng.uniform(0.4, 1.4)))
                lines.append(f"{team},{gpu},{gpus},{t.isoformat()},{end.isoformat()}")
                t = end + timedelta(hours=rng.uniform(0.5, 6.0))  # idle between runs
    n = usage_import_csv(stream=io.StringIO("\n".join(lines) + "\n"), now=now)
    at = start + timedelta(hours=HISTORY_SNAPSHOT_HOURS)
    while at < now:
        fairshare_snapshot_take(now=now, at=at)
        at += timedelta(hours=HISTORY_SNAPSHOT_HOURS)
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
                env=env, gpu_type=gpu_types[gpu], gpus_per_replica=rng.choice([1, 2, 4, size]),
                replicas=rng.choices([1, 2], weights=[5, 1])[0], tier=tiers[tier],
                max_runtime_seconds=3600,
            ))
            submitted += 1
    return submitted
