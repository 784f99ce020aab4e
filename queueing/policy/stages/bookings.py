"""Booked GPUs on the admission pass (docs/scheduling.md, "Booked GPUs", rules W1-W4).

Built once per pass (`plan_bookings`) and only when the snapshot has bookings: a pass
without any never reaches this module (the stages test `p.book is None` first).

- Rule W1, held ahead: for every future booking start T of a GPU type, the GPUs free at
  T (free now, plus the GPUs of running jobs whose estimates end by T) minus the GPUs
  the bookings active at T take, node by node (`Ahead.room`). A job that would still
  run at T is placed only within that room (`place_ahead`), like rule A9's reservation;
  the booking team's own jobs may also use its booked GPUs (`Ahead.own`).
- Rule W2, emptied at its start: an active booking's GPUs are its team's running jobs
  of the type, the GPUs no running job holds, (with `lend`) the lent jobs, and - when
  those are short - other teams' jobs preempted for it, whatever their tier
  (`Preemption.booking`).
- Rule W3, only the team's jobs in it: the free booked GPUs are taken out of the pass's
  capacity (other teams see them as not free); the team's jobs of the type are placed
  on them first, up to the booking's GPUs, outside the team's quota (`into_booking`).
- Rule W4, lent when unused: with `lend`, another team's job of a lending tier
  (`Snapshot.lend_tiers`) may be placed on the free booked GPUs; the team's job takes
  them back at once by preempting them (`take_back`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from queueing.policy.bookings import Booking
from queueing.policy.preemption import Preemption, PreemptionRule, Victim
from queueing.policy.snapshot import RunningJob, Topology
from queueing.policy.workspace import Capacity

from .flavors import pools_for
from .reservation import place_within
from .waits import CODE, Wait, WaitReason

if TYPE_CHECKING:
    from .state import Pass, Step, Try

_RESERVED = CODE[WaitReason.RESERVED]
_ANY = 1 << 30  # no bound: the room of a node no booking is held on


def when_words(at: datetime) -> str:
    """A booking's instant in words: "Thu 14:00 UTC"."""
    return at.strftime("%a %H:%M UTC")


def booking_words(b: Booking) -> str:
    """ "booked for team vision from Thu 14:00 UTC to Thu 18:00 UTC: 8 h100" """
    return (f"booked for team {b.team} from {when_words(b.start)} to {when_words(b.end)}: "
            f"{b.gpus} {b.gpu_type}")


@dataclass(slots=True)
class Ahead:
    """Rule W1 at one future booking start `at` of a GPU type: per node, the GPUs a job
    still running then may take (`room`), and per booking team the booked GPUs its own
    jobs may take besides (`own`). `bookings`: those active at `at`. `beyond`: per
    booking team, the GPUs of its jobs still running then that its bookings do not
    count (preempting them frees GPUs for others; preempting the counted ones frees
    GPUs the bookings then lack)."""

    at: datetime
    room: dict[str, int]
    own: dict[str, dict[str, int]]
    bookings: tuple[Booking, ...]
    short: int = 0  # GPUs the bookings lack at `at` even so (rule W2 frees them then)
    beyond: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Held:
    """Rules W2-W4 for one active booking: its GPUs per node (`region`), the free ones
    taken out of the pass's capacity (`spare`), the GPUs its team's jobs take of it
    (`used`), GPUs not free yet (victims still stopping: `waiting`), the other teams'
    jobs on it that are lent GPUs (`lent`, rule W4), the ids of its team's running jobs
    counted in it (`mine`: no other team's job preempts them, `spared_from`)."""

    booking: Booking
    region: dict[str, int] = field(default_factory=dict)
    spare: dict[str, int] = field(default_factory=dict)
    used: int = 0
    waiting: int = 0
    lent: list[RunningJob] = field(default_factory=list)
    mine: list[int] = field(default_factory=list)

    @property
    def left(self) -> int:
        return self.booking.gpus - self.used


@dataclass(slots=True)
class BookingPass:
    """What the pass knows of the snapshot's bookings."""

    ahead: dict[str, list[Ahead]] = field(default_factory=dict)
    # (team, GPU type) -> its active bookings, by start.
    held: dict[tuple[str, str], list[Held]] = field(default_factory=dict)
    held_types: set[str] = field(default_factory=set)
    blocked: dict[int, str] = field(default_factory=dict)  # job id -> rule W1's words
    # Rule W1: a shape held back by the same booking starts (and rule A9's room) stays
    # held back until some node gains free GPUs (`cap.grown`): the rooms only shrink.
    held_back: dict[tuple[object, ...], tuple[int, str]] = field(default_factory=dict)


def plan_bookings(p: Pass) -> BookingPass:
    """The pass's view of `snapshot.bookings`: rule W1's room at each future start, then
    rules W2-W3's active bookings (their free GPUs taken out of the capacity; the
    victims rule W2 needs appended to `p.preemptions`)."""
    s, cap, now = p.snapshot, p.cap, p.now
    book = BookingPass()
    future = sorted({(b.gpu_type, b.start) for b in s.bookings
                     if b.start > now and b.gpu_type in cap.total})
    for gt, at in future:
        book.ahead.setdefault(gt, []).append(_ahead(p, gt, at))
    active = sorted((b for b in s.bookings if b.active(now) and b.gpu_type in cap.total),
                    key=lambda b: (b.start, b.id))
    claimed: set[int] = set()
    for b in active:
        h = _hold(p, b, claimed)
        book.held.setdefault((b.team, b.gpu_type), []).append(h)
        book.held_types.add(b.gpu_type)
        if h.spare:
            p.waits.booked.setdefault(b.gpu_type, []).append((b.team, b.gpus, b.end))
    return book


def booked_nodes(cap: Capacity, gpu_type: str) -> set[str]:
    """The nodes a booking of `gpu_type` is held on: the type's open nodes (rule K8) but
    spot ones (rule K4: they may be taken back at any time)."""
    return {n for q in cap.pools_of_type.get(gpu_type, ()) if not cap.pool_info[q][2]
            for n in cap.nodes_of[q]}


def _per_node(jobs: list[RunningJob], names: set[str]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for r in jobs:
        for n in r.nodes:
            if n in names:
                out[n] += r.gpus_per_replica
    return out


def _ahead(p: Pass, gt: str, at: datetime) -> Ahead:
    """Rule W1 at `at`: every node's GPUs free then (free now, plus what running jobs
    ending by their estimates before `at` give back), the bookings active then carved
    out of them - first what their teams' own jobs still running then hold, then the
    nodes with the most room then (whole nodes stay whole for the team's gangs), among
    equals those with the fewest GPUs free now (the free ones are left to backfill)."""
    cap, now = p.cap, p.now
    names = booked_nodes(cap, gt)
    base = {n: cap.free[n] for n in names}
    still: list[RunningJob] = []
    for r in p.ws.running_by_type.get(gt, ()):
        end = r.estimated_end(now)
        if end is not None and end <= at:
            for n in r.nodes:
                if n in base:
                    base[n] = min(cap.capacity[n], base[n] + r.gpus_per_replica)
        else:
            still.append(r)
    active = tuple(sorted((b for b in p.snapshot.bookings
                           if b.gpu_type == gt and b.active(at)), key=lambda b: (b.start, b.id)))
    own: dict[str, dict[str, int]] = {}
    short = 0
    team_left: dict[str, int] = defaultdict(int)  # each team job counted in one booking
    for r in still:
        team_left[r.team] += r.total_gpus
    for b in active:
        need = b.gpus
        counted = min(need, team_left[b.team])
        team_left[b.team] -= counted
        need -= counted
        mine = own.setdefault(b.team, defaultdict(int))
        for n in sorted(base, key=lambda n: (-base[n], cap.free[n], n)):
            if need <= 0:
                break
            k = min(base[n], need)
            if k > 0:
                base[n] -= k
                mine[n] += k
                need -= k
        short += need
    beyond = {b.team: team_left[b.team] for b in active}
    return Ahead(at, base, {t: dict(m) for t, m in own.items()}, active, short, beyond)


def _hold(p: Pass, b: Booking, claimed: set[int]) -> Held:
    """Rules W2, W3 for the active booking `b`: its GPUs, its team's jobs counted in it
    (outside the team's quota: the ledger no longer holds them, and the type's pool that
    quotas share loses the booked GPUs; rule R2's running count too), its free GPUs taken
    out of the capacity, and the
    other teams' jobs preempted for it when it is short."""
    cap, ws, gt = p.cap, p.ws, b.gpu_type
    names = booked_nodes(cap, gt)
    h = Held(b)
    running = [r for r in ws.running_by_type.get(gt, ()) if r.id not in claimed]
    mine = [r for r in running if r.team == b.team]
    need = b.gpus
    for r in sorted(mine, key=lambda r: r.id):
        if r.total_gpus > need:
            continue
        claimed.add(r.id)
        h.mine.append(r.id)
        need -= r.total_gpus
        h.used += r.total_gpus
        for n in r.nodes:
            if n in names:
                h.region[n] = h.region.get(n, 0) + r.gpus_per_replica
    held_on = _per_node(list(ws.running_by_type.get(gt, ())), names)
    unheld = {n: max(0, cap.capacity[n] - held_on.get(n, 0)) for n in names}
    from_unheld: dict[str, int] = {}
    for n in sorted(names, key=lambda n: (-(unheld[n] + h.region.get(n, 0)), n)):
        k = min(unheld[n], need)
        if k > 0:
            from_unheld[n] = k
            h.region[n] = h.region.get(n, 0) + k
            need -= k
    others = [r for r in running if r.team != b.team]
    if b.lend:  # rule W4: what the lent jobs hold is the booking's, taken back on demand
        for r in sorted((r for r in others if r.preemptible), key=_r4_key(p)):
            if need <= 0:
                break
            claimed.add(r.id)
            h.lent.append(r)
            need -= r.total_gpus
            for n in r.nodes:
                if n in names:
                    h.region[n] = h.region.get(n, 0) + r.gpus_per_replica
        others = [r for r in others if not r.preemptible]
    if need > 0:
        need = _evict(p, h, sorted(others, key=_r4_key(p)), need, names, claimed)
    for n, k in sorted(from_unheld.items()):
        took = cap.take_free(n, k)
        if took:
            h.spare[n] = took
        h.waiting += k - took
    if h.used:
        p.ledger.remove(b.team, gt, h.used)
        # Nor does rule R2 count them: the team borrows only by its jobs outside it.
        p.ledger.move_running(b.team, gt, -h.used)
    p.ledger.capacity_total[gt] = p.ledger.capacity_total.get(gt, 0) - b.gpus
    return h


def _r4_key(p: Pass) -> Callable[[RunningJob], tuple[int, float, int]]:
    """Rule R4's order of victims: lowest tier, least work lost, then id."""
    now = p.now
    return lambda r: (r.tier_rank, r.total_gpus * r.lost_seconds(now), r.id)


def _evict(p: Pass, h: Held, cands: list[RunningJob], need: int, names: set[str],
           claimed: set[int]) -> int:
    """Rule W2: other teams' jobs of the type, in rule R4's order, preempted until the
    booking has its GPUs; whatever their tier. Their GPUs are the booking's once they
    stop (not free in this pass: they still run). Returns what is still short."""
    b = h.booking
    victims: list[Victim] = []
    for r in cands:
        if need <= 0:
            break
        claimed.add(r.id)
        victims.append(Victim(r.id, r.team, r.tier_rank, r.total_gpus,
                              PreemptionRule.BOOKED))
        need -= r.total_gpus
        h.waiting += r.total_gpus
        for n in r.nodes:
            if n in names:
                h.region[n] = h.region.get(n, 0) + r.gpus_per_replica
    if victims:
        p.preemptions.append(Preemption(0, b.team, b.gpu_type, tuple(victims), (),
                                        booking=b))
    return need


# --- rule W1: a job that would still run at a booking's start ------------------------

# False: every try held back by rule W1 is placed again, the reference the tests hold
# the memo of `place_ahead` (`BookingPass.held_back`) to.
_HELD_BACK = True


def crossing(p: Pass, t: Try) -> list[Ahead]:
    """Rule W1: the future booking starts of the try's GPU type that the job would still
    run at (now + its estimate passes the start, or it has no estimate)."""
    ahead = p.book.ahead.get(t.gt) if p.book is not None else None
    if not ahead:
        return []
    seconds = t.job.max_runtime_seconds
    if seconds is None:
        return ahead
    end = p.now + timedelta(seconds=seconds)
    return [a for a in ahead if end > a.at]


def place_ahead(p: Pass, t: Try, q: str, limits: list[Ahead],
                a9: dict[str, int] | None) -> int:
    """Rule W1 (with rule A9's room `a9` when it applies too): place the gang only on
    GPUs every crossed booking start leaves free then. Returns -1 placed (`t.placement`
    set), `reserved` when it fits now but only on booked GPUs (its words in
    `p.book.blocked`), else the code of why it does not fit at all."""
    from .nodes import why_unplaced

    cap, job, book = p.cap, t.job, p.book
    assert book is not None
    g, reps, cpu, mem, topo = job.gpus_per_replica, job.replicas, t.cpu, t.mem, job.topology
    mine = any(job.team in a.own for a in limits)
    key = (q, g, reps, cpu, mem, topo, tuple(id(a) for a in limits), id(a9),
           job.team if mine else "")
    seen = book.held_back.get(key) if _HELD_BACK else None
    if seen is not None and seen[0] == cap.grown:
        if not cap.fits(q, g, reps, cpu=cpu, memory=mem, topology=topo):
            return why_unplaced(cap, q, g, reps, cpu, mem, topo)
        book.blocked[job.id] = seen[1]
        return _RESERVED
    own = [a.own.get(job.team, {}) for a in limits]
    rooms = [a.room for a in limits] + ([a9] if a9 is not None else [])
    owns = own + ([{}] if a9 is not None else [])

    def avail(n: str) -> int:  # a node no room names (a spot node) is not booked
        return min(r.get(n, _ANY) + o.get(n, 0) for r, o in zip(rooms, owns, strict=True))

    placement = _place_within(cap, q, g, reps, cpu, mem, topo, avail)
    if placement is None:
        if not cap.fits(q, g, reps, cpu=cpu, memory=mem, topology=topo):
            return why_unplaced(cap, q, g, reps, cpu, mem, topo)
        words = book.blocked[job.id] = _blocked_words(limits)
        book.held_back[key] = (cap.grown, words)
        return _RESERVED
    for n in placement:
        for r, o in zip(rooms, owns, strict=True):
            k = min(o.get(n, 0), g)
            if k:
                o[n] -= k
            if n in r:
                r[n] -= g - k
    t.placement = placement
    t.slots = ()
    return -1


def _blocked_words(limits: list[Ahead]) -> str:
    """Rule W1's why-pending words, for the first booking start the job would cross."""
    a = limits[0]
    b = a.bookings[0] if a.bookings else None
    head = booking_words(b) if b is not None else f"booked GPUs from {when_words(a.at)}"
    return (f"{head} are held from {when_words(a.at)}; this job's max runtime would cross "
            "it and no GPUs outside the booking are free (rule W1)")


def _place_within(cap: Capacity, q: str, g: int, reps: int, cpu: int, mem: int,
                  topo: Topology | None, avail: Callable[[str], int],
                  ) -> tuple[str, ...] | None:
    """Best fit (rule A3) of `reps` replicas of `g` GPUs in pool `q` with at most
    `avail(node)` GPUs per node; with CPU, memory or a topology the usual placement,
    kept only if it stays within `avail`. None, changing nothing, when it cannot."""
    if topo is None and (q not in cap.constrained or not (cpu or mem)) and q not in cap.packed:
        # Only nodes with a replica's GPUs free matter, fewest free first: the walk stops
        # once the gang is held (a long queue's crossing jobs are mostly small, or held
        # back where few nodes have that many free).
        slots = 0
        for f, n in cap.nodes_by_free(q, g):
            slots += min(f, avail(n)) // g
            if slots >= reps:
                break
        else:
            return None
        used: dict[str, int] = defaultdict(int)
        taken: list[str] = []
        for _ in range(reps):
            name = next(n for f, n in cap.nodes_by_free(q, g) if avail(n) - used[n] >= g)
            cap.set_free(name, cap.free[name] - g)
            used[name] += g
            taken.append(name)
        return tuple(taken)
    return place_within(cap, q, g, reps, cpu, mem, topo, avail)


def blocked_wait(p: Pass, t: Try) -> Wait | None:
    """Rule W1's wait of a try held back by a booking start, when it was."""
    if p.book is None:
        return None
    words = p.book.blocked.get(t.job.id)
    return None if words is None else Wait(t.job.id, WaitReason.RESERVED, words)


# --- rules W3, W4: the booked GPUs while the booking is on ---------------------------

def _spare_given(cap: Capacity, h: Held) -> None:
    for n, k in h.spare.items():
        cap.give_free(n, k)


def _spare_taken(cap: Capacity, h: Held, placement: tuple[str, ...], g: int,
                 own: bool) -> None:
    """The booking's free GPUs out of the capacity again after a placement: what the
    placement took on a node comes out of the booking's first when `own` (the team's
    job, counted in it), else out of the spare only as far as the node lacks."""
    used: dict[str, int] = defaultdict(int)
    for n in placement:
        used[n] += g
    for n in list(h.spare):
        k = h.spare[n]
        if own:
            k = max(0, k - used.get(n, 0))
        k = cap.take_free(n, k)
        if k:
            h.spare[n] = k
        else:
            del h.spare[n]


def into_booking(p: Pass, t: Try) -> bool | Wait | None:
    """Rule W3: a job of a team with an active booking of its GPU type goes into the
    booking first, when what is left of it holds the job: placed on the booked GPUs
    (and any free ones), counted in the booking, not in its team's quota (True; the
    caller admits it). Not placed: rule W4 takes back lent GPUs for it (a `Wait`), or
    it waits for its booking's GPUs still being freed (a `Wait`), else None - the job
    goes on as any other (its quota, the GPUs free outside the booking)."""
    assert p.book is not None
    waiting: Held | None = None
    for h in p.book.held.get(t.key, ()):
        if h.left < t.total:
            continue
        got = _into(p, t, h)
        if got is not None:
            return got
        if h.waiting:
            waiting = h
    if waiting is None:
        return None
    freeing = waiting.waiting
    _keep(p, t, waiting)
    return Wait(t.job.id, WaitReason.PREEMPTING,
                f"{booking_words(waiting.booking)}: waiting for the other teams' jobs on "
                f"them to release {freeing} GPUs (rule W2)")


def _keep(p: Pass, t: Try, h: Held) -> None:
    """Rules W2, W4 with A5: the team's job waiting for the booking's GPUs still being
    freed claims them, and of its free GPUs what it needs besides, for the rest of the
    pass: kept out of the spare, so they are lent to no other team's job ahead of it (a
    job taken back that stops before its grace is over would be lent them again).
    The nodes of the placement its preemption planned first (rule E2), then those with
    the most free booked GPUs. Counted in the booking (`used`): the team's later jobs
    do not wait for the same GPUs."""
    job = t.job
    freeing = min(h.waiting, t.total)
    h.waiting -= freeing
    h.used += t.total
    need = t.total - freeing
    planned = p.snapshot.nominated_placement.get(job.id, ()) if p.nominated else ()
    first: dict[str, int] = defaultdict(int)
    for n in planned:
        first[n] += job.gpus_per_replica
    for n in sorted(h.spare, key=lambda n: (-first[n], -h.spare[n], n)):
        if need <= 0:
            break
        k = min(need, h.spare[n])
        h.spare[n] -= k
        need -= k
        if not h.spare[n]:
            del h.spare[n]


def _into(p: Pass, t: Try, h: Held) -> bool | Wait | None:
    """`into_booking` on one booking: True placed, a `Wait` of rule W4, else None."""
    job, cap = t.job, p.cap
    g, reps = job.gpus_per_replica, job.replicas
    _spare_given(cap, h)
    placement = None
    pools = list(pools_for(p, job, t.gt)[0])
    for q in pools:
        placement = cap.place(q, g, reps, cpu=t.cpu, memory=t.mem, topology=job.topology)
        if placement is not None:
            t.pool, t.placement, t.slots = q, placement, cap.last_slots
            break
    _spare_taken(cap, h, placement or (), g, own=True)
    if placement is not None:
        h.used += t.total
        _trim(cap, h)
        return True
    return take_back(p, t, h, pools)


def _trim(cap: Capacity, h: Held) -> None:
    """The booking holds free no more than what is left of it: the rest goes back."""
    extra = sum(h.spare.values()) - max(0, h.left)
    for n in sorted(h.spare, key=lambda n: (h.spare[n], n)):
        if extra <= 0:
            break
        k = min(extra, h.spare[n])
        cap.give_free(n, k)
        h.spare[n] -= k
        extra -= k
        if not h.spare[n]:
            del h.spare[n]


def take_back(p: Pass, t: Try, h: Held, pools: list[str]) -> Wait | None:
    """Rule W4: the team's job takes its booked GPUs back from lent jobs at once - the
    fewest lent jobs, in rule R4's order, whose GPUs with the free ones place it; a
    preemption of rule R11's path (`owed`: rules R3, R5 and R9 do not refuse it). The
    placement and what the victims free beside it stay held for it (rule A5)."""
    if not h.lent:
        return None
    job, cap, ws = t.job, p.cap, p.ws
    g, reps = job.gpus_per_replica, job.replicas
    lent = [r for r in sorted(h.lent, key=_r4_key(p)) if r.id not in ws.removed]
    for k in range(1, len(lent) + 1):
        undo = ws.simulate_removal(lent[:k])
        _spare_given(cap, h)
        for q in pools:
            placement = cap.place(q, g, reps, cpu=t.cpu, memory=t.mem, topology=job.topology)
            if placement is not None:
                return _taken_back(p, t, h, lent[:k], q, placement)
        _spare_taken(cap, h, (), g, own=False)
        undo()
    return None


def _taken_back(p: Pass, t: Try, h: Held, victims: list[RunningJob], q: str,
                placement: tuple[str, ...]) -> Wait:
    """Rule W4's preemption made: the victims' GPUs beyond the placement held for it."""
    job, cap = t.job, p.cap
    g = job.gpus_per_replica
    # The placement takes the victims' GPUs first: only what it takes beyond them on a
    # node comes out of the booking's free GPUs, which stay held from other teams (W3).
    on = _per_node(victims, set(cap.free))
    beyond: dict[str, int] = defaultdict(int)
    for n in placement:
        k = min(g, max(0, on.get(n, 0)))
        on[n] = on.get(n, 0) - k
        beyond[n] += g - k
    _spare_taken(cap, h, tuple(n for n, k in beyond.items() for _ in range(k)), 1, own=True)
    for n, k in sorted(on.items()):
        if k > 0:
            cap.take_free(n, k)
    for r in victims:
        h.lent.remove(r)
    h.used += t.total
    # Still being freed for the booking: the victims' GPUs the placement does not take.
    h.waiting += sum(k for k in on.values() if k > 0)
    found = tuple(Victim(r.id, r.team, r.tier_rank, r.total_gpus, PreemptionRule.BOOKED)
                  for r in victims)
    p.preemptions.append(Preemption(job.id, job.team, t.gt, found, placement,
                                    p.pool_info[q][1], owed=True, booking=h.booking))
    return Wait(job.id, WaitReason.PREEMPTING,
                f"{booking_words(h.booking)}: taking back {sum(v.gpus for v in found)} "
                f"GPUs lent to {len(found)} job(s) "
                f"({', '.join('#' + str(v.job_id) for v in found)}; rule W4); "
                "admitted once their GPUs are free")


def lends_to(p: Pass, t: Try) -> bool:
    """Rule W4: may the try use another team's unused booked GPUs of its type? Its tier
    lends (`Snapshot.lend_tiers`) and such a booking that lends has free GPUs."""
    book = p.book
    if book is None or t.gt not in book.held_types or \
            t.job.tier_rank not in p.snapshot.lend_tiers:
        return False
    return any(gt == t.gt and team != t.job.team and h.booking.lend and h.spare
               for (team, gt), hs in book.held.items() for h in hs)


def lend(p: Pass, t: Try, place: Callable[[Pass, Try], Step | None]) -> Step | None:
    """Rule W4: `place(p, t)` with the free GPUs of the other teams' active bookings of
    the type that lend given to the capacity, taken out again after (what the placement
    took of them is lent)."""
    assert p.book is not None
    held = [h for (team, gt), hs in p.book.held.items() for h in hs
            if gt == t.gt and team != t.job.team and h.booking.lend and h.spare]
    for h in held:
        _spare_given(p.cap, h)
    step = place(p, t)
    for h in held:
        _spare_taken(p.cap, h, (), t.job.gpus_per_replica, own=False)
    return step


# --- rules W1, W3, W4: what a preemption may free -------------------------------------

def spared_from(p: Pass, t: Try) -> frozenset[int]:
    """Rules W3, W4: the running jobs the try may not preempt by rules R1-R4 - their
    GPUs are a booking's once freed, which the try could not use, or only as lent GPUs
    the booking's team takes back at once:
    - the lent jobs, unless the try is of a lending tier of another team (the booking's
      team takes them back by `take_back`);
    - another team's booking's own jobs (`Held.mine`): counted in the booking, not in
      their team's quota, so rule R2 reclaims nothing by them, and their GPUs would only
      be lent to the try, then taken back for the job it preempted (on the trace, two
      jobs preempting each other every cycle of the booking: docs/simulator.md)."""
    book = p.book
    if book is None or t.gt not in book.held_types:
        return frozenset()
    job = t.job
    lent_to = job.tier_rank in p.snapshot.lend_tiers
    out = {r.id for (team, gt), hs in book.held.items() if gt == t.gt
           for h in hs if not (lent_to and team != job.team and h.booking.lend)
           for r in h.lent}
    out.update(i for (team, gt), hs in book.held.items() if gt == t.gt and team != job.team
               for h in hs for i in h.mine)
    return frozenset(out)


def ahead_of_victims(p: Pass, t: Try, found: Preemption, take: bool = False) -> bool:
    """Rule W1 on a preemption's placement: a job that would still run at a booking
    start takes no more of a node than every start it crosses leaves free then - rule
    W1's room, its team's own booked GPUs, and the GPUs of its victims that would still
    run then (their estimates: freed by the preemption, not counted in the room) beyond
    what the bookings lack then (`Ahead.short`: those are the bookings'). False
    when the placement passes it (the caller puts the victims back: a preemption for a
    placement rule W1 refuses frees GPUs the job could never use); else True, and with
    `take` (the preemption made) what it takes out of the rooms."""
    limits = crossing(p, t)
    if not limits:
        return True
    job, now = t.job, p.now
    g = job.gpus_per_replica
    victims = [p.ws.running_by_id[v.job_id] for v in found.victims]
    use: dict[str, int] = defaultdict(int)
    for n in found.placement:
        use[n] += g
    plans: list[tuple[Ahead, str, int, int]] = []
    shorts: list[tuple[Ahead, int, dict[str, int]]] = []
    for a in limits:
        freed: dict[str, int] = defaultdict(int)
        for r in victims:
            end = r.estimated_end(now)
            if end is None or end > a.at:
                for n in r.nodes:
                    if n in a.room:
                        freed[n] += r.gpus_per_replica
        # What the bookings lack then (rule W2 would free it at the start) comes first
        # out of the victims' GPUs: another team's job taking their place would be
        # preempted then (a booking team's would run in its booking: W2, W3). So does
        # what a victim counted in a booking then leaves it lacking: the booking team's
        # jobs beyond what `beyond` spares (else its own job is placed there again and
        # preempted again, the preemptor never placed).
        ours = any(b.team == job.team for b in a.bookings)
        gone = {} if ours else _booked_victims(a, victims, now)
        lacks = sum(max(0, k - a.beyond.get(team, 0)) for team, k in gone.items())
        short = 0 if ours else min(a.short + lacks, sum(freed.values()))
        shorts.append((a, min(short, a.short), gone))
        for n in sorted(freed, key=lambda n: (use.get(n, 0), -freed[n], n)):
            k = min(short, freed[n])
            freed[n] -= k
            short -= k
        own = a.own.get(job.team, {})
        for n, k in use.items():
            if n not in a.room:
                continue  # not a booked node (rule K4's spot nodes)
            mine = min(own.get(n, 0), k)
            rest = max(0, k - mine - freed[n])
            if rest > a.room[n]:
                return False
            plans.append((a, n, mine, rest))
    if take:
        for a, n, mine, rest in plans:
            if mine:
                a.own[job.team][n] -= mine
            a.room[n] -= rest
        for a, short, gone in shorts:
            a.short -= short
            for team, k in gone.items():
                a.beyond[team] = max(0, a.beyond.get(team, 0) - k)
    return True


def _booked_victims(a: Ahead, victims: list[RunningJob], now: datetime) -> dict[str, int]:
    """Rule W1: per team booking at `a.at`, the GPUs of its victims still running then
    (what of them `a.beyond` does not spare, the team's bookings lack at the start once
    they are preempted)."""
    teams = {b.team for b in a.bookings}
    gone: dict[str, int] = defaultdict(int)
    for r in victims:
        end = r.estimated_end(now)
        if r.team in teams and (end is None or end > a.at):
            gone[r.team] += r.total_gpus
    return dict(gone)
