"""fairq's own usage history as a workload: what-if on real history (docs/simulator.md,
"fairq's own history").

Input: the CSV `manage.py export_usage` writes (`team,gpu_type,gpus,start,end`, ISO 8601
instants with an offset), one row per attempt that held GPUs, and a scenario for the
cluster, teams and tiers. Each row becomes one job of its team and GPU type:

- submitted at the row's start (the export holds no submit time: the replay's waits are
  those the replayed policy adds to the history, not the history's own), relative to the
  first row;
- running `end − start` seconds (its estimate the same);
- of `tier` (default: the scenario's lowest tier; the export holds no tier);
- as a gang of `replicas × gpus_per_replica = gpus` where `gpus_per_replica` is the
  largest divisor of `gpus` that a node of the type holds (the export holds no replica
  split).

A row that cannot be read, or names a team or GPU type the scenario lacks, is refused
with its line number; nothing is run.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime
from pathlib import Path

from .model import SimJob, Workload
from .scenario import ScenarioError

COLUMNS = ("team", "gpu_type", "gpus", "start", "end")


def _instant(value: str, where: str) -> datetime:
    try:
        when = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise ScenarioError(f"{where}: {value!r} is not an ISO 8601 instant") from None
    if when.tzinfo is None:
        raise ScenarioError(f"{where}: {value!r} has no UTC offset")
    return when


def load_usage_history(path: str | Path, scenario: Workload, *,
                       tier: str | None = None) -> Workload:
    """The usage CSV in `path` as the jobs of `scenario`'s cluster (its own jobs, if any,
    are replaced)."""
    sc = scenario.scenario
    tier_name = tier or min(sc.tiers, key=lambda t: t.rank).name
    if tier_name not in {t.name for t in sc.tiers}:
        raise ScenarioError(f"--history-tier: no tier {tier_name!r} in the scenario")
    teams = {t.name for t in sc.teams}
    largest: dict[str, int] = {}
    for n in sc.nodes:
        largest[n.gpu_type] = max(largest.get(n.gpu_type, 0), n.gpus)

    def slots(gt: str, per: int) -> int:
        return sum(n.gpus // per for n in sc.nodes if n.gpu_type == gt)

    rows: list[tuple[datetime, int, str, str, int, float]] = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not UTF-8 text") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise ScenarioError(f"{path}: the header must be {','.join(COLUMNS)} "
                            f"(manage.py export_usage)")
    for line, r in enumerate(reader, start=2):
        where = f"{path}:{line}"
        team, gt = r["team"], r["gpu_type"]
        if team not in teams:
            raise ScenarioError(f"{where}: team {team!r} is not in the scenario")
        if gt not in largest:
            raise ScenarioError(f"{where}: no node pool of GPU type {gt!r} in the scenario")
        try:
            gpus = int(r["gpus"])
        except (TypeError, ValueError):
            raise ScenarioError(f"{where}: gpus {r['gpus']!r} is not an integer") from None
        if gpus < 1:
            raise ScenarioError(f"{where}: gpus must be >= 1")
        per = max(d for d in range(1, min(gpus, largest[gt]) + 1) if gpus % d == 0)
        if slots(gt, per) < gpus // per:
            raise ScenarioError(f"{where}: {gpus} {gt} GPUs never fit the scenario's cluster")
        start, end = _instant(r["start"], where), _instant(r["end"], where)
        if end <= start:
            continue  # no time held: nothing to replay
        rows.append((start, line, team, gt, gpus, (end - start).total_seconds()))
    if not rows:
        raise ScenarioError(f"{path}: no usage row to replay")
    rows.sort()
    first = rows[0][0]
    jobs = []
    for i, (start, _, team, gt, gpus, runtime) in enumerate(rows):
        per = max(d for d in range(1, min(gpus, largest[gt]) + 1) if gpus % d == 0)
        jobs.append(SimJob(id=i + 1, team=team, tier=tier_name, gpu_type=gt,
                           gpus_per_replica=per, replicas=gpus // per,
                           submit=(start - first).total_seconds(), runtime=runtime,
                           estimate=runtime))
    horizon = max(j.submit for j in jobs) or max(j.runtime for j in jobs)
    return Workload(scenario=sc, jobs=tuple(jobs), horizon=horizon,
                    source={"kind": "usage-history", "rows": len(jobs), "tier": tier_name,
                            "first": first.isoformat()})
