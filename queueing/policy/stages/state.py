"""What one planning pass carries from job to job: the working copy of the snapshot
(`Workspace`), the pass's results so far, and the memos the stages keep to answer a long
queue quickly (each held to its plain reference by tests/policy/test_plan_fast_paths.py).
Only the stages change it; the snapshot is never changed."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from queueing.policy.preemption import Preemption
from queueing.policy.priority import PriorityWeights
from queueing.policy.snapshot import QueuedJob, Snapshot, Topology
from queueing.policy.workspace import Workspace

from .admit import Admission
from .bookings import plan_bookings
from .heads import Charges, QueueOrder, StaticFactors
from .preempt import Protected
from .reservation import Reservation
from .waits import CODE, WaitReason, Waits

# A queued job's GPU type, allowed clusters, spot_ok and shape (GPUs, replicas, CPU,
# memory, topology): what decides its pools and whether they hold it.
StaticKey = tuple[str, frozenset[str] | None, bool, int, int, int, int, Topology | None]
# A victim search's key: team, GPU type (or pool), tier and shape.
SearchKey = tuple[str, str, int, int, int, int, int, Topology | None]
# A gang shape in one pool: (pool, GPUs, replicas, CPU, memory, topology).
Shape = tuple[str, int, int, int, int, Topology | None]
# (reason code, held, ceiling, rule K3's pool or ""): a wait the replay may give again.
Step = tuple[int, int, int, str] | tuple[()]
# A stage's answer that the job is decided (a wait or an admission) with nothing for the
# replay of waits to keep.
DONE: Step = ()
_CAPACITY = CODE[WaitReason.CAPACITY]


def cluster_gpus(s: Snapshot) -> float:
    """Rule P1's cluster size: the open nodes' GPUs (rule K8), in GPU-equivalents (rule
    H4: a packed node's slices / S, a MIG node's instances / S)."""
    if not s.units_per_gpu:
        return sum(n.capacity for n in s.open_nodes())
    return sum(s.gpus_of(n.gpu_type, n.capacity) for n in s.open_nodes())


class Pass:
    """The state of one `plan_admissions` pass."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = s = snapshot
        self.now = now = s.now
        self.ws = ws = Workspace(s)
        self.cap, self.ledger = cap, ledger = ws.capacity, ws.ledger
        state = s.fair_share_state
        self.factors = Charges(state.copy() if state is not None
                               else StaticFactors(s.fair_share))
        self.queued_teams = {j.team for j in s.queued}
        usage_total = 0.0 if state is None else sum(state.usage(t) for t in self.queued_teams)
        self.order = QueueOrder(s.queued, factors=self.factors,
                                weights=s.priority_weights or PriorityWeights(), now=now,
                                cluster_gpus=cluster_gpus(s),  # K8, H4
                                units_per_gpu=s.units_per_gpu,
                                first=s.nominated, usage_total=usage_total)
        self.jobs: list[QueuedJob] = self.order.jobs
        self.waits = Waits(self.jobs, now)
        self.waits.pool_info = cap.pool_info
        self.waits.several = len(cap.clusters) > 1
        self.waits.packed = cap.packed
        self.raw = self.waits._raw
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.never_met: dict[int, str] = {}
        self.pre = pre = s.preemption
        self.may_search = pre.enabled and pre.max_searches > 0
        # Rule R11: owed claims preempt even when no search is left (`stages/owed.py`);
        # none can be owed when no team has a nominal quota.
        self.owed_on = pre.enabled and any(q.nominal > 0 for q in s.quotas.values())
        # Per (team, GPU type), GPUs held per tier rank (the running jobs but the victims
        # taken, plus what this pass admitted or preempted for): built on first use,
        # `owed_log` keeping the pass's additions until then.
        self.tier_held: dict[tuple[str, str], dict[int, int]] | None = None
        self.owed_log: list[tuple[str, str, int, int]] = []
        # Rule Q7 (`owed._ancestors_within`): per (team, GPU type, tier rank, GPUs) the
        # answer at `owed_moves_under` of the team's top-level node, the count of
        # changes to `tier_held` under it.
        self.owed_moves_under: dict[str, int] = {}
        self.q7_seen: dict[tuple[str, str, int, int], tuple[int, bool]] = {}
        # Rule Q4: the (node, GPU type) of each entry of `waits.tree_limits` -> its index;
        # per (team, GPU type) the lending wait's words (their entry in `waits.lending`) at
        # the type's ledger moves.
        self.tree_limit_index: dict[tuple[str, str], int] = {}
        self.lending_words: dict[tuple[str, str], tuple[int, int]] = {}
        # Per GPU type, the GPUs of teams borrowing beyond their nominal (`owed.may_find`).
        self.borrowed: dict[str, tuple[int, int, dict[str, int]]] = {}
        self.searches = 0
        self.nominated = s.nominated
        self.held, self.ceilings = ledger.held, ledger.ceiling
        self.largest = cap.largest_node
        self.pool_info = cap.pool_info
        # Rule A8: members of each array holding GPUs.
        self.array_active: defaultdict[int, int] = defaultdict(int)
        if s.array_limits:
            for r in s.running:
                if r.array_id is not None:
                    self.array_active[r.array_id] += 1
        self._memos()
        self._preemption_memos()
        # Rules W1-W4: the snapshot's bookings; None (nothing to look at) without any.
        self.book = plan_bookings(self) if s.bookings else None

    def _memos(self) -> None:
        """The memos of flavor assignment and node fit (rules K1-K4, A2-A7, A9, E2, E3)."""
        # Rules K1-K4: per (GPU type, clusters, spot_ok) the pools it may use and the
        # others; per static key those, the ones that hold the gang empty, and the wait
        # when none does; per pool set rule K2's order at `cap.changes`.
        self.pool_sets: dict[tuple[str, frozenset[str] | None, bool],
                             tuple[tuple[str, ...], tuple[str, ...]]] = {}
        self.statics: dict[StaticKey, tuple[tuple[str, ...], tuple[str, ...],
                                            tuple[str, ...], tuple[int, int, int]]] = {}
        self.k2_seen: dict[tuple[str, ...], tuple[int, tuple[str, ...]]] = {}
        # A gang shape that did not fit stays unfit until some node gains free GPUs, CPU
        # or memory: (`cap.grown` then, the wait reason code).
        self.unfit: dict[Shape, tuple[int, int]] = {}
        # Rule A6: (cpu, memory, grown, code) per size of the failures (`dominated`).
        self.unfit_by_size: dict[tuple[str, int, int, Topology | None],
                                 list[tuple[int, int, int, int]]] = {}
        # Per static key: a job found unfit in all its pools at `cap.grown`, and the
        # reason said (rule K2's first pool's); never `cpu_memory`.
        self.all_unfit: dict[StaticKey, tuple[int, int]] = {}
        # Rule K3: whether a shape fits now in a pool (at `cap.changes`).
        self.fits_elsewhere: dict[Shape, tuple[int, bool]] = {}
        # Rule E2: GPUs held for preemptors per pool and node, the latest holder per
        # pool, every hold of the pass (a memo knows when the holds changed), and per
        # shape whether it fits on the held GPUs (at `cap.changes`).
        self.holds: dict[str, dict[str, int]] = {}
        self.holder: dict[str, int] = {}
        self.hold_log: list[int] = []
        self.fits_held: dict[tuple[str, int, int], tuple[int, int]] = {}
        # Rule E3: the largest free block per set of pools, at `cap.changes`; a capacity
        # wait's answer per static key at (`cap.changes`, holds).
        self.block_seen: dict[tuple[str, ...], tuple[int, int]] = {}
        self.wait_seen: dict[StaticKey, tuple[int, int, tuple[int, int, int, str]]] = {}
        # Rule A9: per GPU type at most one reservation, for the first job in queue order
        # that waits for capacity (`decided` once it was looked for); the jobs this pass
        # admitted with an estimate per type; shapes that fit now but not beside the
        # reservation, at `cap.grown`.
        self.reserve_on = self.snapshot.reservation
        self.reserved: dict[str, Reservation] = {}
        self.decided: set[str] = set()
        self.admitted_ends: dict[str, list[tuple[datetime, int, tuple[str, ...], int]]] = {}
        self.held_back: dict[Shape, int] = {}

    def _preemption_memos(self) -> None:
        """The memos of the victim search (rules R4, R5, R9, E4)."""
        self.preempted_by_team: defaultdict[str, int] = defaultdict(int)
        self.search_failed: set[SearchKey] = set()
        # Rule R11: failed searches of owed claims (rule R3 protecting no candidate).
        self.owed_search_failed: set[SearchKey] = set()
        # Rule R5: searches refused by the rate limit, with the victims they needed.
        self.rate_refused: dict[SearchKey, int] = {}
        # Rule R9: per search key, the least work (GPU-seconds) refused victims lose.
        self.r9_refused: dict[tuple[SearchKey, frozenset[str] | None], float] = {}
        # Rule E4: per failed search, when the first protected candidate becomes a victim;
        # rule E4's candidates per GPU type.
        self.protected_for: dict[tuple[SearchKey, frozenset[str] | None],
                                 tuple[datetime, int] | None] = {}
        self.protected_of_type: dict[str, Protected] = {}


class Try:
    """One queued job tried on one GPU type: its shape, and what the stages found so far
    (its quota, its pools, where it was placed or why not)."""

    __slots__ = ("cpu", "excluded", "fitting", "gt", "index", "job", "k2", "key", "lending",
                 "may_reserve", "mem", "multi", "over", "owed", "placement", "pool", "skey",
                 "slots", "total", "why_not")

    def __init__(self, job: QueuedJob, index: int, gpu_type: str, cpu: int, mem: int) -> None:
        self.job, self.index, self.gt = job, index, gpu_type
        self.total = job.gpus_per_replica * job.replicas
        self.key = (job.team, gpu_type)
        # Rule A6 only where the nodes of the type report CPU or memory.
        self.cpu, self.mem = cpu, mem
        self.over = self.lending = self.may_reserve = False
        # Rule G5: one of several GPU types the job accepts (the reservation of rule A9
        # is made once all were tried, on the type where it comes first).
        self.multi = False
        self.skey: StaticKey = (gpu_type, job.clusters, job.spot_ok, job.gpus_per_replica,
                                job.replicas, cpu, mem, job.topology)
        self.excluded: tuple[str, ...] = ()
        self.fitting: tuple[str, ...] = ()
        self.placement: tuple[str, ...] | None = None
        self.slots: tuple[int, ...] = ()  # rule H3: the GPU of each fraction placed
        self.pool = ""
        self.why_not = _CAPACITY
        self.k2: tuple[str, ...] | None = None
        # Rule R11 (`owed.owed`): the team's nominal of the type when the try is an owed
        # claim that preempts at once, 0 when it is not, -1 until asked.
        self.owed = -1
