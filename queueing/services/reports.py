"""The reports page's roll-up (docs/dashboard.md, "Reports"): the GPU-hours of charged
attempts per UTC day, team and GPU type, added once per usage record."""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime

from django.db import transaction

from queueing.models import UsageDay, UsageRecord, UsageRollup
from queueing.policy.costs import cost_pieces
from queueing.selectors.costs import attempts

BATCH = 20_000


@transaction.atomic
def usage_days_roll_up(*, now: datetime, batch: int = BATCH) -> int:
    """Add the usage records after the roll-up's last one (at most `batch`, oldest
    first) to `UsageDay`, cut at UTC midnights (rule C2), and move the mark past them,
    in one transaction under the roll-up row's lock (a concurrent run waits, then finds
    nothing new). Returns the records added."""
    state, _ = UsageRollup.objects.select_for_update().get_or_create(pk=1)
    newer = UsageRecord.objects.filter(pk__gt=state.last_record_id)
    nth = list(newer.order_by("pk").values_list("pk", flat=True)[batch - 1:batch])
    last = nth[0] if nth else newer.order_by("-pk").values_list("pk", flat=True).first()
    if last is None:
        return 0
    acc: dict[tuple[date, int, int], list[float]] = defaultdict(
        lambda: [0.0, 0.0, 0.0, 0.0, 0.0])
    n = 0
    for a in attempts(team_ids=None, start=None, end=None, now=None,
                      records_after=state.last_record_id, records_up_to=last):
        n += 1
        cell = None
        for piece in cost_pieces(gpus=a.gpus, start=a.start, end=a.end, prices=()):
            cell = acc[(piece.day, a.team_id, a.gpu_type_id)]
            h = piece.gpu_hours
            cell[0] += h
            cell[1] += h * a.used_fraction
            cell[2] += h * a.idle_fraction
            cell[3] += h if a.preempted else 0.0
        if cell is not None:
            cell[4] += a.lost  # a preemption's lost work, on its day (the last piece)
    if acc:
        days = {k[0] for k in acc}
        existing = {(r.day, r.team_id, r.gpu_type_id): r for r in UsageDay.objects.filter(
            day__in=days, team_id__in={k[1] for k in acc},
            gpu_type_id__in={k[2] for k in acc})}
        new, changed = [], []
        for (day, team_id, gpu_type_id), (alloc, used, idle, pre, lost) in acc.items():
            row = existing.get((day, team_id, gpu_type_id))
            if row is None:
                new.append(UsageDay(day=day, team_id=team_id, gpu_type_id=gpu_type_id,
                                    allocated_gpu_hours=alloc, used_gpu_hours=used,
                                    idle_gpu_hours=idle, preempted_gpu_hours=pre,
                                    lost_gpu_hours=lost))
                continue
            row.allocated_gpu_hours += alloc
            row.used_gpu_hours += used
            row.idle_gpu_hours += idle
            row.preempted_gpu_hours += pre
            row.lost_gpu_hours += lost
            changed.append(row)
        UsageDay.objects.bulk_create(new, batch_size=5000)
        UsageDay.objects.bulk_update(changed, ["allocated_gpu_hours", "used_gpu_hours",
                                               "idle_gpu_hours", "preempted_gpu_hours",
                                               "lost_gpu_hours"],
                                     batch_size=5000)
    state.last_record_id, state.updated_at = last, now
    state.save(update_fields=["last_record_id", "updated_at"])
    return n
