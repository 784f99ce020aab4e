"""A YAML scenario (docs/simulator.md, "Scenarios"; examples in bench/scenarios/): the
cluster's node pools and GPU types (or several clusters with their pools, spot ones with
an interruption rate: "Several clusters and spot capacity"), teams with weights and
parents, quotas, tiers, fair-share, priority and preemption settings, and optionally the jobs themselves.

Every value is checked; a bad one raises `ScenarioError` naming its field
(`teams[2].weight: must be > 0`) and nothing is run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from queueing.policy.priority import PriorityWeights
from queueing.policy.settings import DEFAULTS, PolicySettings, PreemptionPolicy
from queueing.policy.snapshot import QuotaLimit

from .bookings import BookingError, booking_spec
from .model import (
    BookingSpec,
    ClusterSpec,
    NodeSpec,
    Scenario,
    SimJob,
    TeamSpec,
    TierSpec,
    Workload,
)
from .trace import nominal_by_weight


class ScenarioError(ValueError):
    """A scenario value that cannot be used; the message starts with the field's path."""


def _map(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{where}: must be a mapping")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ScenarioError(f"{where}: must be a list")
    return value


def _num(m: Mapping[str, Any], key: str, where: str, *, default: float | None = None,
         minimum: float | None = 0.0, strict: bool = False, integer: bool = False) -> float:
    v = m.get(key, default)
    if v is None or isinstance(v, bool) or not isinstance(v, int | float):
        raise ScenarioError(f"{where}.{key}: must be a number" + (" (required)" if v is None else ""))
    if integer and int(v) != v:
        raise ScenarioError(f"{where}.{key}: must be a whole number")
    if minimum is not None and (v < minimum or (strict and v == minimum)):
        raise ScenarioError(f"{where}.{key}: must be {'>' if strict else '>='} {minimum:g}")
    return float(v)


def _str(m: Mapping[str, Any], key: str, where: str) -> str:
    v = m.get(key)
    if not isinstance(v, str) or not v.strip():
        raise ScenarioError(f"{where}.{key}: must be a non-empty string")
    return v.strip()


def _bool(m: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    v = m.get(key, default)
    if not isinstance(v, bool):
        raise ScenarioError(f"{where}.{key}: must be true or false")
    return v


def _opt_int(m: Mapping[str, Any], key: str, where: str) -> int | None:
    if m.get(key) is None:
        return None
    return int(_num(m, key, where, integer=True))


def parse_settings(doc: Mapping[str, Any]) -> PolicySettings:
    """The `fair_share`, `priority`, `preemption` and `gpu_types` sections over the
    product's defaults (`queueing.policy.settings.DEFAULTS`, what the service uses too)."""
    fs = _map(doc.get("fair_share"), "fair_share")
    pr = _map(doc.get("priority"), "priority")
    pe = _map(doc.get("preemption"), "preemption")
    gts = _map(doc.get("gpu_types"), "gpu_types")
    d, dp = DEFAULTS.priority, DEFAULTS.preemption
    billing = {str(k): _num(_map(v, f"gpu_types.{k}"), "billing_weight", f"gpu_types.{k}",
                            default=1.0, strict=True) for k, v in gts.items()}

    def optional_int(key: str, default: int | None) -> int | None:
        if pe.get(key, default) is None:  # null: no limit
            return None
        return int(_num(pe, key, "preemption", default=default, integer=True))

    return PolicySettings(
        half_life_hours=_num(fs, "half_life_hours", "fair_share",
                             default=DEFAULTS.half_life_hours, strict=True),
        interval_seconds=_num(fs, "interval_seconds", "fair_share",
                              default=DEFAULTS.interval_seconds),
        cycle_seconds=_num(doc, "cycle_seconds", "scenario",
                           default=DEFAULTS.cycle_seconds, strict=True),
        priority=PriorityWeights(
            fair_share=_num(pr, "fair_share", "priority", default=d.fair_share),
            age=_num(pr, "age", "priority", default=d.age),
            size=_num(pr, "size", "priority", default=d.size),
            max_age_seconds=_num(pr, "max_age_hours", "priority",
                                 default=d.max_age_seconds / 3600.0) * 3600.0,
            favor_small=_bool(pr, "favor_small", "priority", d.favor_small)),
        billing_weights=billing,
        preemption=PreemptionPolicy(
            enabled=_bool(pe, "enabled", "preemption", dp.enabled),
            max_per_team=optional_int("max_per_team", dp.max_per_team),
            window_seconds=_num(pe, "window_seconds", "preemption", default=dp.window_seconds),
            termination_grace_seconds=_num(pe, "termination_grace_seconds", "preemption",
                                           default=dp.termination_grace_seconds),
            nomination_seconds=_num(pe, "nomination_seconds", "preemption",
                                    default=dp.nomination_seconds),
            max_searches=int(_num(pe, "max_searches", "preemption", default=dp.max_searches,
                                  integer=True)),
            max_preemptions_per_job=optional_int("max_preemptions_per_job",
                                                 dp.max_preemptions_per_job),
            lost_per_wait=None if pe.get("lost_per_wait", dp.lost_per_wait) is None else _num(
                pe, "lost_per_wait", "preemption", default=dp.lost_per_wait)),
        reservation=_bool(doc, "reservation", "scenario", DEFAULTS.reservation),
    )


def parse_scenario(doc: Any) -> Workload:
    """A scenario document (parsed YAML) as a workload: its cluster and, when it lists
    `jobs`, those jobs (else none: give a trace too)."""
    doc = _map(doc, "scenario")
    known = {"cluster", "clusters", "gpu_types", "teams", "quotas", "tiers", "fair_share",
             "priority", "preemption", "jobs", "horizon_seconds", "cycle_seconds", "reservation",
             "seed", "bookings"}
    for key in doc:
        if key not in known:
            raise ScenarioError(f"{key}: unknown section; known: {', '.join(sorted(known))}")
    nodes, clusters = _nodes(doc)
    teams: list[TeamSpec] = []
    for i, t in enumerate(_list(doc.get("teams"), "teams")):
        w = f"teams[{i}]"
        t = _map(t, w)
        parent = t.get("parent")
        teams.append(TeamSpec(_str(t, "name", w), _num(t, "weight", w, default=1.0, strict=True),
                              str(parent) if parent is not None else None))
    if not teams:
        raise ScenarioError("teams: at least one team is needed")
    names = {t.name for t in teams}
    if len(names) != len(teams):
        raise ScenarioError("teams: two teams have the same name")
    for i, t in enumerate(teams):
        if t.parent is not None and t.parent not in names:
            raise ScenarioError(f"teams[{i}].parent: no team {t.parent!r}")
    tiers: list[TierSpec] = []
    for i, t in enumerate(_list(doc.get("tiers"), "tiers")):
        w = f"tiers[{i}]"
        t = _map(t, w)
        tiers.append(TierSpec(_str(t, "name", w), int(_num(t, "rank", w, minimum=None, integer=True)),
                              _bool(t, "preemptible", w, True),
                              int(_num(t, "min_runtime_seconds", w, default=0, integer=True)),
                              None if t.get("grace_seconds") is None else
                              _num(t, "grace_seconds", w),
                              None if t.get("lost_per_wait") is None else
                              _num(t, "lost_per_wait", w, minimum=-1),
                              _bool(t, "owed_preempts_at_once", w, True)))
    if not tiers:
        raise ScenarioError("tiers: at least one tier is needed")
    if len({t.name for t in tiers}) != len(tiers) or len({t.rank for t in tiers}) != len(tiers):
        raise ScenarioError("tiers: names and ranks must be unique")
    gpu_types = sorted({n.gpu_type for n in nodes})
    quotas: dict[tuple[str, str], QuotaLimit] = {}
    if "quotas" in doc:
        for i, q in enumerate(_list(doc.get("quotas"), "quotas")):
            w = f"quotas[{i}]"
            q = _map(q, w)
            team, gt = _team_and_type(q, w, names, gpu_types)
            nominal = int(_num(q, "nominal", w, integer=True))
            lending = _opt_int(q, "lending_limit", w)
            if lending is not None and lending > nominal:
                raise ScenarioError(f"{w}.lending_limit: cannot lend more than the nominal {nominal}")
            quotas[(team, gt)] = QuotaLimit(nominal, _opt_int(q, "borrowing_limit", w), lending)
        _check_carved(teams, quotas)
    else:
        # Nominal by weight among the leaf teams (a parent holds no jobs), no borrowing limit.
        parents = {t.parent for t in teams}
        leaves = [t for t in teams if t.name not in parents]
        for gt in gpu_types:
            total = sum(n.gpus for n in nodes if n.gpu_type == gt)
            for t, nominal in zip(leaves, nominal_by_weight(total, [t.weight for t in leaves]),
                                  strict=True):
                quotas[(t.name, gt)] = QuotaLimit(nominal)
    settings = parse_settings(doc)
    slices = _slices(doc, gpu_types)
    scenario = Scenario(nodes=tuple(nodes), teams=tuple(teams), tiers=tuple(tiers),
                        quotas=quotas, settings=settings, clusters=clusters,
                        seed=int(_num(doc, "seed", "scenario", default=0, integer=True)),
                        slices=slices, bookings=_bookings(doc, names, nodes))
    jobs: list[SimJob] = []
    tier_names = {t.name for t in tiers}
    largest = {gt: max(n.gpus for n in nodes if n.gpu_type == gt) for gt in gpu_types}
    for i, j in enumerate(_list(doc.get("jobs"), "jobs")):
        w = f"jobs[{i}]"
        j = _map(j, w)
        team, tier, gt = _str(j, "team", w), _str(j, "tier", w), _str(j, "gpu_type", w)
        if team not in names:
            raise ScenarioError(f"{w}.team: no team {team!r}")
        if tier not in tier_names:
            raise ScenarioError(f"{w}.tier: no tier {tier!r}")
        if gt not in largest:
            raise ScenarioError(f"{w}.gpu_type: no node pool of {gt!r}")
        pin = None
        if j.get("cluster") is not None:
            pin = _str(j, "cluster", w)
            if pin not in {c.name for c in clusters}:
                raise ScenarioError(f"{w}.cluster: no cluster {pin!r}")
        allow_spot = _bool(j, "allow_spot", w, False)
        g = int(_num(j, "gpus_per_replica", w, default=1, strict=True, integer=True))
        if g > largest[gt]:
            raise ScenarioError(f"{w}.gpus_per_replica: no {gt} node has {g} GPUs")
        k = int(_num(j, "gpu_slices", w, default=0, integer=True))
        if k:
            # Shared GPUs: k slices of ONE GPU of a time-sliced or MPS type, k < S.
            if gt not in slices:
                raise ScenarioError(f"{w}.gpu_slices: {gt} is not time-sliced or MPS "
                                    "(gpu_types.<type>.sharing)")
            if k >= slices[gt]:
                raise ScenarioError(f"{w}.gpu_slices: a fraction is fewer than the "
                                    f"{slices[gt]} slices of one {gt} GPU; ask whole GPUs "
                                    "with gpus_per_replica")
            if g != 1:
                raise ScenarioError(f"{w}.gpus_per_replica: a fraction (gpu_slices) is on "
                                    "one GPU: 1")
        runtime = _num(j, "runtime_seconds", w, strict=True)
        estimate = _num(j, "max_runtime_seconds", w, default=runtime, strict=True)
        if estimate < runtime:
            raise ScenarioError(f"{w}.max_runtime_seconds: below runtime_seconds")
        interval = None if j.get("checkpoint_interval_seconds") is None else _num(
            j, "checkpoint_interval_seconds", w, strict=True)
        count = int(_num(j, "count", w, default=1, strict=True, integer=True))
        every = _num(j, "every_seconds", w, default=0.0)
        submit = _num(j, "submit_seconds", w, default=0.0)
        reps = int(_num(j, "replicas", w, default=1, strict=True, integer=True))
        # Rules K1, K4: the gang fits the nodes of one cluster and one kind it may use.
        spot_ok = allow_spot or next(t for t in tiers if t.name == tier).preemptible
        room: dict[tuple[str, bool], int] = {}
        for n in nodes:
            if n.gpu_type == gt and (pin is None or n.cluster == pin) and (spot_ok or not n.spot):
                room[(n.cluster, n.spot)] = room.get((n.cluster, n.spot), 0) + n.gpus // g
        if max(room.values(), default=0) < reps:
            raise ScenarioError(f"{w}.replicas: {reps} replicas of {g} GPUs never fit the "
                                f"{gt} nodes" + (" of one cluster it may use" if clusters else ""))
        for c in range(count):
            s_per = slices.get(gt, 1)
            jobs.append(SimJob(id=0, team=team, tier=tier, gpu_type=gt, gpus_per_replica=g,
                               replicas=reps, submit=submit + c * every, runtime=runtime,
                               estimate=estimate, cluster=pin, allow_spot=allow_spot,
                               checkpoint_interval=interval, gpu_slices=k,
                               slices_per_gpu=s_per, asked=k / s_per if k else None))
    jobs.sort(key=lambda j: j.submit)  # stable: the file's order among equal submits
    numbered = tuple(replace(j, id=i + 1) for i, j in enumerate(jobs))
    last = max((j.submit for j in numbered), default=0.0)
    horizon = _num(doc, "horizon_seconds", "scenario", default=last) if "horizon_seconds" in doc \
        else last
    if horizon <= 0:
        horizon = max((j.submit + j.runtime for j in numbered), default=1.0)
    return Workload(scenario=scenario, jobs=numbered, horizon=horizon,
                    source={"kind": "scenario", "jobs": len(numbered)})


def _team_and_type(m: Mapping[str, Any], w: str, names: set[str],
                   gpu_types: Iterable[str]) -> tuple[str, str]:
    """An entry's `team` and `gpu_type`, each one the scenario has."""
    team, gt = _str(m, "team", w), _str(m, "gpu_type", w)
    if team not in names:
        raise ScenarioError(f"{w}.team: no team {team!r}")
    if gt not in gpu_types:
        raise ScenarioError(f"{w}.gpu_type: no node pool of {gt!r}")
    return team, gt


def _check_carved(teams: list[TeamSpec], quotas: Mapping[tuple[str, str], QuotaLimit]) -> None:
    """Rule Q3: a department's nominal is its subtree's; its children's nominals are
    carved out of it, so they may not add up to more (a department without a row of a
    type has the sum of its children's)."""
    order = [t.name for t in teams]
    for (dept, gt), q in sorted(quotas.items(), key=lambda x: (order.index(x[0][0]), x[0][1])):
        kids = [t.name for t in teams if t.parent == dept]
        carved = sum(_nominal(k, gt, teams, quotas) for k in kids)
        if kids and carved > q.nominal:
            raise ScenarioError(
                f"quotas[{list(quotas).index((dept, gt))}].nominal: the nominals of "
                f"{dept}'s children ({', '.join(kids)}) add up to {carved} {gt}, more than "
                f"its {q.nominal} (rule Q3: they are carved out of it)")


def _nominal(team: str, gt: str, teams: list[TeamSpec],
             quotas: Mapping[tuple[str, str], QuotaLimit]) -> int:
    if (team, gt) in quotas:
        return quotas[(team, gt)].nominal
    return sum(_nominal(t.name, gt, teams, quotas) for t in teams if t.parent == team)


def _bookings(doc: Mapping[str, Any], names: set[str],
              nodes: list[NodeSpec]) -> tuple[BookingSpec, ...]:
    """`bookings:` (docs/simulator.md, "Quotas in a tree and bookings"): each with team,
    gpu_type, gpus, start_seconds (from the run's instant 0), duration_seconds,
    recurrence (an RFC 5545 RRULE, "" = once), timezone (IANA, UTC) and lend (true)."""
    out = []
    capacity: dict[str, int] = {}
    for n in nodes:
        capacity[n.gpu_type] = capacity.get(n.gpu_type, 0) + n.gpus
    for i, b in enumerate(_list(doc.get("bookings"), "bookings")):
        w = f"bookings[{i}]"
        b = _map(b, w)
        team, gt = _team_and_type(b, w, names, capacity)
        gpus = int(_num(b, "gpus", w, strict=True, integer=True))
        if gpus > capacity[gt]:
            raise ScenarioError(f"{w}.gpus: the cluster has {capacity[gt]} {gt}")
        rule = str(b.get("recurrence") or "")
        tz = str(b.get("timezone") or "UTC")
        try:
            spec = booking_spec(team, gt, gpus, _num(b, "start_seconds", w),
                                _num(b, "duration_seconds", w, strict=True), rule, tz,
                                _bool(b, "lend", w, True))
        except BookingError as exc:
            raise ScenarioError(f"{w}.{exc}") from None
        out.append(spec)
    return tuple(out)


SHARING = ("exclusive", "mig", "time-sliced", "mps")


def _slices(doc: Mapping[str, Any], gpu_types: list[str]) -> dict[str, int]:
    """`gpu_types.<type>.sharing` and `slices_per_gpu` (docs/simulator.md, "Fractional
    GPUs"): the time-sliced and MPS types with their slices per GPU (S >= 2). An
    exclusive type has 1; a MIG type is a profile whose instances are whole devices to
    the simulator, so it stays out."""
    out: dict[str, int] = {}
    for k, v in _map(doc.get("gpu_types"), "gpu_types").items():
        w = f"gpu_types.{k}"
        v = _map(v, w)
        sharing = v.get("sharing", "exclusive")
        if sharing not in SHARING:
            raise ScenarioError(f"{w}.sharing: one of {', '.join(SHARING)}")
        s = int(_num(v, "slices_per_gpu", w, default=1, strict=True, integer=True))
        if sharing == "exclusive" and s != 1:
            raise ScenarioError(f"{w}.slices_per_gpu: an exclusive type has 1")
        if sharing in ("time-sliced", "mps"):
            if not 2 <= s <= 64:
                raise ScenarioError(f"{w}.slices_per_gpu: 2-64 for {sharing}")
            if str(k) not in gpu_types:
                raise ScenarioError(f"{w}: no node pool of {k!r}")
            out[str(k)] = s
    return out


_SLUG = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def _pool_nodes(p: Any, w: str, cluster: str) -> list[NodeSpec]:
    """One node pool's nodes: `count` nodes named "<pool>-<k>" (with a cluster,
    "<cluster>/<pool>-<k>"); spot ones with their interruption rate and replacement."""
    p = _map(p, w)
    gt = _str(p, "gpu_type", w)
    name = str(p.get("name") or gt)
    count = int(_num(p, "nodes", w, strict=True, integer=True))
    per = int(_num(p, "gpus_per_node", w, strict=True, integer=True))
    spot = _bool(p, "spot", w, False)
    rate = _num(p, "interruptions_per_hour", w, default=0.0)
    minutes = _num(p, "replacement_minutes", w, default=10.0)
    if not spot and (rate or "replacement_minutes" in p):
        raise ScenarioError(f"{w}.interruptions_per_hour: only a spot pool (spot: true) is "
                            "interrupted")
    prefix = f"{cluster}/{name}" if cluster else name
    return [NodeSpec(f"{prefix}-{k:03d}", gt, per, cluster=cluster, spot=spot,
                     interruptions_per_hour=rate, replacement_seconds=minutes * 60.0)
            for k in range(count)]


def _nodes(doc: Mapping[str, Any]) -> tuple[list[NodeSpec], tuple[ClusterSpec, ...]]:
    """`cluster.node_pools` (one implicit cluster, "") or `clusters` (rules K1-K7: each
    with its name, cost_rank, labels and node pools)."""
    if "cluster" in doc and "clusters" in doc:
        raise ScenarioError("clusters: give either cluster (one) or clusters (several)")
    nodes: list[NodeSpec] = []
    specs: list[ClusterSpec] = []
    if "clusters" in doc:
        entries = _list(doc.get("clusters"), "clusters")
        if not entries:
            raise ScenarioError("clusters: at least one cluster is needed")
        for i, c in enumerate(entries):
            w = f"clusters[{i}]"
            c = _map(c, w)
            name = _str(c, "name", w)
            if not _SLUG.match(name):
                raise ScenarioError(f"{w}.name: lowercase letters, digits and '-' only")
            labels = _map(c.get("labels"), f"{w}.labels")
            specs.append(ClusterSpec(name, int(_num(c, "cost_rank", w, default=0, minimum=None,
                                                    integer=True)),
                                     {str(k): str(v) for k, v in labels.items()}))
            pools = _list(c.get("node_pools"), f"{w}.node_pools")
            if not pools:
                raise ScenarioError(f"{w}.node_pools: at least one pool is needed")
            for k, p in enumerate(pools):
                nodes += _pool_nodes(p, f"{w}.node_pools[{k}]", name)
        if len({c.name for c in specs}) != len(specs):
            raise ScenarioError("clusters: two clusters have the same name")
    else:
        pools = _list(_map(doc.get("cluster"), "cluster").get("node_pools"),
                      "cluster.node_pools")
        if not pools:
            raise ScenarioError("cluster.node_pools: at least one pool is needed")
        for i, p in enumerate(pools):
            nodes += _pool_nodes(p, f"cluster.node_pools[{i}]", "")
    if len({n.name for n in nodes}) != len(nodes):
        raise ScenarioError(("clusters: two pools of one cluster" if specs else
                             "cluster.node_pools: two pools") + " have the same name")
    return nodes, tuple(specs)


def load_scenario(path: str | Path) -> Workload:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ScenarioError(f"{path}: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from None
    return parse_scenario(doc)
