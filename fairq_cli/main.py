"""`fairq`: submit, watch and inspect GPU jobs like Slurm's sbatch/squeue/sshare/sprio.

Exit codes (docs/cli.md): 0 success; 1 the server said no (one line on stderr); 2 bad
usage; 3 a job followed with `--wait` failed; 4 it was cancelled; 5 fairq could not be
reached; 6 `--timeout` passed; 7 `--wait` gave up on an unreachable fairq (after
`--unreachable-timeout`) with the job not ended when last seen; 141 stdout's reader left.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any, TextIO

import yaml

from .arrays import MAX_ARRAY_TASKS, ArraySpec, ArraySpecError, parse_array_spec
from .client import ApiError, Client, Transport
from .config import ConfigError, load_config
from .durations import format_duration, parse_duration
from .reservations import ReservationUsage
from .reservations import add_parser as add_reservation_parser
from .reservations import run as run_reservations
from .sessions import SessionUsage
from .sessions import add_parser as add_session_parser
from .sessions import run as run_session

FINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
ACTIVE = ["QUEUED", "ADMITTED", "RUNNING", "PREEMPTED"]
# squeue's state codes; ADMITTED is "configuring" (placed, not yet running).
STATE_CODES = {"QUEUED": "PD", "ADMITTED": "CF", "RUNNING": "R", "PREEMPTED": "PR",
               "SUCCEEDED": "CD", "FAILED": "F", "CANCELLED": "CA"}
JOB_FIELDS = ["team", "name", "image", "command", "args", "env", "gpu_type", "gpu_types", "gpus",
              "replicas", "tier", "max_runtime_seconds", "resources", "shm_size", "topology",
              "volumes", "secrets", "image_pull_secret", "working_dir", "labels",
              "annotations", "termination_grace_seconds", "dependencies",
              "requested_cluster", "cluster_selector", "allow_spot",
              "stop_signal", "checkpoint_interval_seconds"]
# A job file's durations as people write them -> the body's seconds.
FILE_DURATIONS = {"time": "max_runtime_seconds", "checkpoint_every": "checkpoint_interval_seconds"}
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")
# Per-replica resources: the flag's dest -> the key of the body's `resources`.
RESOURCE_FLAGS = {"cpu": "cpu", "memory": "memory", "ephemeral_storage": "ephemeral_storage"}


EXIT_SERVER_SAID_NO = 1
EXIT_USAGE = 2
EXIT_JOB_FAILED = 3
EXIT_JOB_CANCELLED = 4
EXIT_UNREACHABLE = 5
EXIT_WAIT_TIMEOUT = 6
EXIT_GAVE_UP = 7  # --wait: fairq unreachable too long while the job had not ended
EXIT_BROKEN_PIPE = 141  # the reader of stdout left (`| head`): 128 + SIGPIPE, as a shell reports
# A long poll's `wait` (the server caps it at 60): FAIRQ_WATCH_SECONDS lowers it behind a
# proxy that drops idle connections sooner.
WATCH_SECONDS = 30
# `submit -a --wait`: how long to wait before looking again when none of the array's
# members is a job yet (the server writes them as its scheduler needs them).
_ARRAY_POLL_SECONDS = 2.0
RETRY_FIRST, RETRY_MAX = 1.0, 30.0  # seconds between tries while fairq is unreachable


class UsageError(Exception):
    pass


class Unreachable(Exception):
    """fairq did not answer for longer than the caller would wait."""


class GaveUp(Exception):
    """`--wait` stopped waiting on an unreachable fairq while what it followed had not
    ended when last seen: the job goes on without the CLI (exit 7). `reason`: why fairq
    was given up on."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class WaitTimeout(Exception):
    pass


# --- formatting ------------------------------------------------------------------------


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in cells]
    return "\n".join(lines)


def parse_time(text: str) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text)


def elapsed(job: dict[str, Any], now: datetime) -> str:
    start = parse_time(job.get("started_at") or "")
    if start is None:
        return "0:00"
    end = parse_time(job.get("finished_at") or "") or now
    s = max(0, int((end - start).total_seconds()))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    hms = f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else hms


def hms(seconds: int) -> str:
    """Elapsed time as sacct prints it: [D-]HH:MM:SS."""
    d, s = divmod(max(0, int(seconds)), 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


def instant_arg(text: str, flag: str, zone: tzinfo | None = UTC) -> str:
    """`2026-10-01`, `2026-10-01T08:00` (in `zone`, the zone times are printed in, without
    an offset) or an ISO 8601 instant with an offset -> the ISO 8601 instant the API
    takes."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"bad {flag} {text!r}: use 2026-10-01, 2026-10-01T08:00 or an "
                         "ISO 8601 instant with an offset") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=zone) if zone is not None else when.astimezone()
    return when.isoformat()


def stamp(when: datetime | str | None, zone: tzinfo | None) -> str:
    """Every time the CLI prints, one way (docs/cli.md, "Times"): ISO 8601 to the
    second in the user's zone with its offset (`2026-10-01T10:00:00+02:00`), or in UTC
    with `Z` (`--utc`, FAIRQ_UTC=1, `utc = true`; a zone of offset 0 prints `Z` too).
    `zone` None: the local zone. "" for no time."""
    if isinstance(when, str):
        when = parse_time(when)
    if when is None:
        return ""
    if when.tzinfo is None:  # the API writes offsets; a bare one is UTC
        when = when.replace(tzinfo=UTC)
    local = when.astimezone(zone)
    offset = local.utcoffset() or timedelta(0)
    if not offset:
        return local.strftime("%Y-%m-%dT%H:%M:%SZ")
    sign = "-" if offset < timedelta(0) else "+"
    minutes = int(abs(offset).total_seconds()) // 60
    return local.strftime("%Y-%m-%dT%H:%M:%S") + f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def array_arg(text: str) -> tuple[str, ArraySpec]:
    """`-a N[%M]` (N tasks, at most M at once) or Slurm's indices (`0-99%4`, `1,3,5`,
    `0-15:4`, combinations: fairq_cli/arrays.py, the server's reading too)."""
    try:
        return text.strip(), parse_array_spec(text, max_tasks=MAX_ARRAY_TASKS)
    except ArraySpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_DEPENDENCY_TYPES = {"afterok": "after_ok", "afterany": "after_any",
                     "afternotok": "after_not_ok"}


def dependency_arg(text: str) -> list[dict[str, Any]]:
    """Slurm's `--dependency` syntax: `afterok:12:13,afterany:14`, a job id or `a<ID>` for
    a whole array (`afterok:a7`) -> the API's `dependencies`."""
    out: list[dict[str, Any]] = []
    for part in text.split(","):
        kind, *ids = part.strip().split(":")
        if kind not in _DEPENDENCY_TYPES or not ids:
            raise UsageError(f"--dependency wants TYPE:ID[:ID...][,...] with TYPE one of "
                             f"{', '.join(_DEPENDENCY_TYPES)}, not {part!r}")
        for ident in ids:
            m = re.fullmatch(r"(a?)(\d+)", ident.strip())
            if not m:
                raise UsageError(f"--dependency: {ident!r} is neither a job id nor a<ARRAY ID>")
            out.append({"type": _DEPENDENCY_TYPES[kind],
                        "array" if m.group(1) else "job": int(m.group(2))})
    return out


def duration_seconds(text: str) -> int:
    """`90`, `30m`, `2h`, `1h30m`, `1d`, `1:30:00` (h:m:s) or `45:00` (m:s) -> seconds
    (`durations.parse_duration`, the web's submit form's parser too)."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# --- the watch ---------------------------------------------------------------------------


def _watch_seconds() -> int:
    raw = os.environ.get("FAIRQ_WATCH_SECONDS", "")
    if not raw:
        return WATCH_SECONDS
    if not raw.isdigit() or not 1 <= int(raw) <= 60:
        raise UsageError(f"FAIRQ_WATCH_SECONDS must be 1..60 seconds, not {raw!r}")
    return int(raw)


class Watcher:
    """Follows jobs with the API's long poll (`GET /jobs/{id}/?wait=S&since_event=N`):
    one request per change or per `seconds`, not one per poll interval. While fairq
    cannot be reached (a restart, a 5xx from the proxy) it retries with backoff (1 s,
    2 s, 4 s, ... 30 s), saying so on stderr, and gives up after `give_up` seconds."""

    def __init__(self, app: App, *, give_up: float, deadline: float | None, seconds: int,
                 verbose: bool) -> None:
        self.app = app
        self.give_up = give_up
        self.deadline = deadline
        self.seconds = seconds
        self.verbose = verbose
        self.since: dict[int, int] = {}

    def _get(self, job_id: int, params: dict[str, Any]) -> tuple[int, Any]:
        status, body, headers = self.get(f"/jobs/{job_id}/", params)
        if headers.get("fairq-last-event", "").isdigit():
            self.since[job_id] = int(headers["fairq-last-event"])
        return status, body

    def get(self, path: str, params: dict[str, Any] | list[tuple[str, Any]]
            ) -> tuple[int, Any, dict[str, str]]:
        """One GET, retried with backoff while fairq cannot be reached."""
        down_since: float | None = None
        delay = RETRY_FIRST
        while True:
            try:
                status, body, headers = self.app.client.fetch(
                    path, params=params, timeout=float(dict(params).get("wait", 0)) + 30.0)
            except ApiError as exc:
                if exc.code != "unreachable" and exc.status < 500:
                    raise
                now = time.monotonic()
                down_since = now if down_since is None else down_since
                left = self.give_up - (now - down_since)
                if left <= 0:  # the last try was at the limit, not a backoff step before it
                    raise Unreachable(f"fairq unreachable for {now - down_since:.0f}s "
                                      f"(--unreachable-timeout {self.give_up:g}s): "
                                      f"{exc.message}") from None
                pause = min(delay, left)
                self.app.err.write(f"fairq unreachable, retrying in {pause:.0f}s\n")
                self.app.err.flush()
                self.app.sleep(pause)
                delay = min(delay * 2, RETRY_MAX)
                continue
            if down_since is not None:
                self.app.err.write("fairq reachable again\n")
            return status, body, headers

    def _params(self, job_id: int, seconds: int) -> dict[str, Any]:
        params: dict[str, Any] = {"wait": seconds}
        if job_id in self.since:
            params["since_event"] = self.since[job_id]
        return params

    def pause(self, job_id: int, *, seconds: int) -> None:
        """Return when the job changed or after `seconds`, whichever comes first."""
        self._get(job_id, self._params(job_id, min(max(1, seconds), 60)))

    def follow(self, job_id: int) -> dict[str, Any]:
        """The job once it is final, reporting on stderr each state it passed through
        (from its transition events: none is missed when several happen between two
        answers)."""
        try:
            job: dict[str, Any] = self._get(job_id, {})[1]
        except Unreachable as exc:
            raise GaveUp(f"stopped waiting: {exc}. Job {job_id} was not seen since it was "
                         f"submitted: it is queued or further, this command only stopped "
                         f"watching (fairq status {job_id})", str(exc)) from None
        if self.verbose:
            self._report(job, job["status"], None)
        seen = max([e.get("id") or 0 for e in job.get("events") or []], default=0)
        while True:
            if job["status"] in FINAL:
                return job
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise WaitTimeout(f"job {job_id} is still {job['status']} after --timeout: "
                                  f"{_goes_on(job['status'])}")
            seconds = self.seconds if self.deadline is None else \
                max(1, min(self.seconds, int(self.deadline - time.monotonic()) + 1))
            try:
                status, body = self._get(job_id, self._params(job_id, seconds))
            except Unreachable as exc:
                raise GaveUp(f"stopped waiting: {exc}. Job {job_id} was {job['status']} when "
                             f"last seen: {_goes_on(job['status'])} (fairq status "
                             f"{job_id})", str(exc)) from None
            if status != 200:
                continue
            job = body
            for e in job.get("events") or []:
                if (e.get("id") or 0) > seen and e.get("kind") == "transition" and \
                        e.get("to_status") and self.verbose:
                    self._report(job, e["to_status"], e)
            seen = max([seen, *[e.get("id") or 0 for e in job.get("events") or []]])

    def _report(self, job: dict[str, Any], status: str, event: dict[str, Any] | None) -> None:
        when = parse_time(event["at"]) if event and event.get("at") else None
        at = stamp(when or datetime.now(UTC), self.app.zone)
        extra = ""
        current = status == job["status"]
        queue = job.get("queue") or {}
        if status == "QUEUED" and current and queue.get("reasons"):
            extra = f" ({queue['reasons'][0]['message']})"
        elif status in {"ADMITTED", "RUNNING"} and current and job.get("placement"):
            extra = f" on {_nodes(job['placement'])}"
        elif event and event.get("reason") and status not in {"QUEUED", "ADMITTED", "RUNNING"}:
            extra = f" ({event['reason']})"
        self.app.err.write(f"[{at}] job {job['id']} {status}{extra}\n")
        self.app.err.flush()


# --- commands ----------------------------------------------------------------------------


class App:
    def __init__(self, client: Client, *, as_json: bool, out: TextIO, err: TextIO,
                 sleep: Callable[[float], None] = time.sleep,
                 zone: tzinfo | None = None) -> None:
        self.zone = zone  # None: the local zone (docs/cli.md, "Times")
        self.client = client
        self.as_json = as_json
        self.out = out
        self.err = err
        self.sleep = sleep

    def stamp(self, when: datetime | str | None) -> str:
        return stamp(when, self.zone)

    def emit_json(self, data: Any) -> None:
        self.out.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")

    def say(self, text: str) -> None:
        self.out.write(text + "\n")

    # fairq submit
    def submit(self, a: argparse.Namespace) -> int:
        body = job_from_args(a)
        if a.wait:
            _watch_seconds()  # a bad setting is said before anything is submitted
        if a.dependency:
            body["dependencies"] = dependency_arg(a.dependency)
        if a.array:
            text, spec = a.array
            most = spec.max_running
            # Indices 0..N-1 as `count` (any server takes it), others as Slurm wrote them.
            size: dict[str, Any] = {"count": spec.count} if spec.dense else {"array": text}
            created = self.client.post("/jobs/bulk/", {
                **body, **size, **({"max_running": most} if most and spec.dense else {})})
            if self.as_json and not a.wait:
                self.emit_json(created)
            elif not self.as_json:
                ids = created["ids"]
                # The server writes the first members as jobs now, the rest as its
                # scheduler needs them: `ids` may be fewer than `count`.
                later = created["count"] - len(ids)
                which = "" if spec.dense else f" (indices {text.partition('%')[0]})"
                self.say(f"Submitted array job of {created['count']}{which}: "
                         f"jobs {ids[0]}..{ids[-1]}"
                         f"{f' and {later} more as they are scheduled' if later else ''} "
                         f"(array {created['array_id']}"
                         f"{f', at most {most} at once' if most else ''})")
            if not a.wait:
                return 0
            if created["count"] > 1:
                return self.wait_array(created["array_id"], a)
            return self.wait_all(created["ids"], a)
        job = self.client.post("/jobs/", body)
        if self.as_json and not a.wait:
            self.emit_json(job)
        elif not self.as_json:
            self.say(f"Submitted job {job['id']} ({job['team']}/{job['name']}, "
                     f"{gpus_text(job)}"
                     f"{'' if job['replicas'] == 1 else ' x' + str(job['replicas'])}, "
                     f"tier {job['tier']})")
        if not a.wait:
            return 0
        return self.wait_all([job["id"]], a)

    def wait_all(self, ids: Sequence[int], a: argparse.Namespace) -> int:
        """Follow every job of `ids` to its end (one at a time: a job that ended while
        another was followed answers at once); the exit code says how they ended."""
        deadline = None if a.timeout is None else time.monotonic() + a.timeout
        watcher = Watcher(self, give_up=a.unreachable_timeout, deadline=deadline,
                          seconds=_watch_seconds(), verbose=len(ids) == 1 and not self.as_json)
        finals = [watcher.follow(job_id) for job_id in ids]
        if self.as_json:
            self.emit_json(finals[0] if len(finals) == 1 else finals)
        for job in finals:
            if job["status"] != "SUCCEEDED":
                reason = job.get("message") or job["status"].lower()
                code = "" if job.get("exit_code") is None else f" (exit code {job['exit_code']})"
                self.err.write(f"fairq: job {job['id']} {job['status']}{code}: {reason}\n")
        if len(finals) > 1 and not self.as_json:
            counts: dict[str, int] = {}
            for job in finals:
                counts[job["status"]] = counts.get(job["status"], 0) + 1
            self.say(f"Array of {len(finals)}: " + ", ".join(
                f"{n} {st.lower()}" for st, n in sorted(counts.items())))
        elif finals[0]["status"] == "SUCCEEDED" and not self.as_json:
            self.say(f"Job {finals[0]['id']} succeeded in "
                     f"{elapsed(finals[0], datetime.now(UTC))}")
        statuses = {job["status"] for job in finals}
        if "FAILED" in statuses:
            return EXIT_JOB_FAILED
        if "CANCELLED" in statuses:
            return EXIT_JOB_CANCELLED
        return 0

    def wait_array(self, array_id: int, a: argparse.Namespace) -> int:
        """Wait for every member of an array with a few requests however large it is:
        the array's counts (`GET /arrays/{id}/`) until `done`, and meanwhile the long poll
        on one member not ended (members that end while it is followed are skipped by the
        next look); the exit code says how they ended."""
        deadline = None if a.timeout is None else time.monotonic() + a.timeout
        watcher = Watcher(self, give_up=a.unreachable_timeout, deadline=deadline,
                          seconds=_watch_seconds(), verbose=False)
        active = [("array", array_id), *[("status", s) for s in ACTIVE], ("page_size", 1)]
        summary: dict[str, Any] | None = None
        while True:
            try:
                summary = watcher.get(f"/arrays/{array_id}/", {})[1]
                if summary["done"]:
                    break
                page = watcher.get("/jobs/", active)[1]
                if page["results"]:
                    watcher.follow(page["results"][0]["id"])
                else:  # the rest not written as jobs yet: the next scheduler cycle does
                    time.sleep(_ARRAY_POLL_SECONDS)
            except (Unreachable, GaveUp) as exc:
                reason = exc.reason if isinstance(exc, GaveUp) else str(exc)
                left = "its members" if summary is None else \
                    f"{sum(n for st, n in summary['counts'].items() if st not in FINAL)} " \
                    f"of its {summary['count']} members"
                raise GaveUp(f"stopped waiting: {reason}. Array {array_id}: {left} had not "
                             "ended when last seen: they are still queued or running, this "
                             f"command only stopped watching (fairq queue)", reason) from None
        counts = {st: n for st, n in summary["counts"].items() if n}
        ended_badly = [st for st in ("FAILED", "CANCELLED") if counts.get(st)]
        if self.as_json:
            self.emit_json(self.client.pages("/jobs/", [("array", array_id), ("page_size", 500)],
                                             limit=summary["count"]))
        else:
            for st in ended_badly:  # say which, at most 20 of each
                for job in self.client.pages("/jobs/", [("array", array_id), ("status", st),
                                                        ("page_size", 20)], limit=20):
                    reason = job.get("message") or st.lower()
                    code = "" if job.get("exit_code") is None else \
                        f" (exit code {job['exit_code']})"
                    self.err.write(f"fairq: job {job['id']} {st}{code}: {reason}\n")
            self.say(f"Array of {summary['count']}: " + ", ".join(
                f"{n} {st.lower()}" for st, n in sorted(counts.items())))
        if "FAILED" in ended_badly:
            return EXIT_JOB_FAILED
        if "CANCELLED" in ended_badly:
            return EXIT_JOB_CANCELLED
        return 0

    # fairq queue
    def queue(self, a: argparse.Namespace) -> int:
        params: list[tuple[str, Any]] = []
        states = [s.upper() for s in a.state.split(",")] if a.state else ([] if a.all else ACTIVE)
        params += [("status", s) for s in states]
        for key in ("team", "tier", "gpu_type", "name", "cluster"):
            if getattr(a, key):
                params.append((key, getattr(a, key)))
        if a.user:
            params.append(("submitter", a.user))
        params += [("label", label) for label in a.label or []]
        params.append(("page_size", min(a.limit, 500)))
        jobs = self.client.pages("/jobs/", params, a.limit)
        queued = [j for j in jobs if j["status"] == "QUEUED"]
        if a.start:
            jobs = queued
        # Position, reason and estimated start of the queued jobs: one request for all
        # (rules P2, P3, P4), unless the list already carries position and reason.
        starts: dict[int, dict[str, Any]] = {}
        if queued and (a.start or any("position" not in j or "reason" not in j
                                      for j in queued)):
            data = self.client.get("/jobs/starts/", team=a.team)
            starts = {s["id"]: s for s in data["jobs"]}
            for j in queued:
                got = starts.get(j["id"], {})
                j.setdefault("position", got.get("position"))
                j.setdefault("reason", got.get("reason"))
                if a.start:
                    j["estimated_start"] = got.get("estimated_start")
        if self.as_json:
            self.emit_json(jobs)
            return 0
        now = datetime.now(UTC)
        rows = []
        for j in sorted(jobs, key=_queue_order):
            if j["status"] in {"ADMITTED", "RUNNING"} and j.get("placement"):
                where = ",".join(sorted(set(map(str, j["placement"]))))
            elif j["status"] == "QUEUED":
                reason = j.get("reason") or {}
                where = f"({reason.get('message') or reason.get('code') or 'unknown'})"
            else:
                where = f"({j.get('message') or j['status'].title()})"[:40]
            row = [j["id"], j["team"], j["name"][:24], j.get("submitter") or "", j["tier"],
                   STATE_CODES.get(j["status"], j["status"])]
            if a.start:
                row += [j.get("position") or "", self.stamp(j.get("estimated_start")) or "N/A"]
            else:
                row += [elapsed(j, now)]
            # Rule K1: the one cluster it runs in ("-" until placed, or with no clusters).
            rows.append([*row, gpus_text(j), j["replicas"],
                         j.get("cluster") or "-", where])
        middle = ["POS", "START_TIME"] if a.start else ["TIME"]
        self.say(table(rows, ["JOBID", "TEAM", "NAME", "USER", "TIER", "ST", *middle, "GPUS",
                              "NODES", "CLUSTER", "NODELIST(REASON)"]))
        return 0

    # fairq clusters
    def clusters(self, a: argparse.Namespace) -> int:
        """Every cluster (rule K2's order: cost rank, then name), one line per GPU type:
        GPUs, free, spot GPUs (free), and whether the scheduler reaches it (rule K5) or,
        disabled, whether it still drains (rule K8: JOBS are the ones still there)."""
        clusters = self.client.get("/clusters/")
        if self.as_json:
            self.emit_json(clusters)
            return 0
        rows: list[list[Any]] = []
        for c in clusters:
            name = c["name"] or "(default)"
            if c.get("state") == "draining":  # rule K8: disabled, its jobs run on
                state = "draining"
            elif not c["enabled"]:
                state = "drained" if c.get("state") == "drained" else "disabled"
            elif c["reachable"]:
                state = "up"
            else:
                state = f"unreachable since {self.stamp(c.get('unreachable_since'))}"
            labels = ",".join(f"{k}={v}" for k, v in sorted((c.get("labels") or {}).items()))
            types = c.get("gpu_types") or [{}]
            for i, g in enumerate(types):
                spot = f"{g['spot_capacity']} ({g['spot_free']} free)" \
                    if g.get("spot_capacity") else "-"
                first = i == 0
                rows.append([name if first else "", c["cost_rank"] if first else "",
                             state if first else "", g.get("gpu_type", "-"),
                             g.get("nodes", 0), g.get("capacity", 0), g.get("free", 0), spot,
                             c.get("running_jobs", 0) if first else "",
                             (labels or "-") if first else ""])
        self.say(table(rows, ["CLUSTER", "RANK", "STATE", "GPU_TYPE", "NODES", "GPUS", "FREE",
                              "SPOT", "JOBS", "LABELS"]))
        return 0

    # fairq quota-tree
    def quota_tree(self, a: argparse.Namespace) -> int:
        """The quota tree per GPU type (GET /quota-tree/): departments with their teams
        indented, each node's nominal ("(32)": no row of its own, its teams' sum), held,
        borrowing, lent, available and limits; a line per type for the fleet."""
        trees = self.client.get("/quota-tree/", gpu_type=a.gpu_type)
        if self.as_json:
            self.emit_json(trees)
            return 0
        blocks = []
        for t in trees:
            head = (f"{t['gpu_type']}: {t['held']} of {t['capacity']} in use, "
                    f"{t['available']} available, {t['unassigned']} unassigned")
            rows: list[list[Any]] = []

            def walk(nodes: list[dict[str, Any]], depth: int, rows: list[list[Any]] = rows
                     ) -> None:
                for n in nodes:
                    nominal = n["nominal"] if n["has_quota_row"] else f"({n['nominal']})"
                    limits = [f"borrow<={n['borrowing_limit']}"
                              if n["borrowing_limit"] is not None else "",
                              f"lend<={n['lending_limit']}"
                              if n["lending_limit"] is not None else ""]
                    rows.append(["  " * depth + n["team"], nominal, n["held"],
                                 n["borrowing"], n["lent"],
                                 "-" if n["available"] is None else n["available"],
                                 " ".join(x for x in limits if x) or "-"])
                    walk(n["children"], depth + 1)

            walk(t["teams"], 0)
            blocks.append(head + ("\n" + table(rows, ["TEAM", "NOMINAL", "HELD", "BORROWING",
                                                      "LENT", "AVAILABLE", "LIMITS"])
                                  if rows else "\n(no quotas)"))
        self.say("\n\n".join(blocks) if blocks else "No GPU types.")
        return 0

    # fairq status ID
    def status(self, a: argparse.Namespace) -> int:
        job = self.client.get(f"/jobs/{a.job_id}/")
        if self.as_json:
            self.emit_json(job)
            return 0
        now = datetime.now(UTC)
        lines = [
            f"Job {job['id']}: {job['name']}  ({job['team']}, submitted by {job.get('submitter')})",
            f"  State     {job['status']} (attempt {job['attempt']})"
            + (f", exit code {job['exit_code']}" if job.get("exit_code") is not None else ""),
            (f"  Resources {fraction_text(job)} of {job['gpu_type']} per replica, "
             f"{job['replicas']} replica(s), {job['total_gpus']:g} GPUs; tier {job['tier']}"
             if job.get("gpu_slices") else
             f"  Resources {job['gpus']} x {job['gpu_type']} per replica, {job['replicas']} "
             f"replica(s), {job['total_gpus']} GPUs; tier {job['tier']}"),
            *(["  Sharing   no memory isolation: the jobs sharing its GPU can use (and "
               "exhaust) all of its memory"] if job.get("gpu_sharing") in ("time-sliced", "mps")
              else []),
            *([f"  GPU types {', '.join(job['gpu_types'])} (most preferred first; "
               + ("it waits for one of them)" if job["status"] == "QUEUED"
                  else f"{job['gpu_type']} chosen)")]
              if len(job.get("gpu_types") or []) > 1 else []),
            f"  Image     {job['image']} {' '.join(job['command'] + job['args'])}".rstrip(),
            f"  Submitted {self.stamp(job['created_at'])}",
            f"  Runtime   {elapsed(job, now)}"
            + (f" (limit {job['max_runtime_seconds']}s)" if job.get("max_runtime_seconds") else ""),
        ]
        per_replica = [f"{k.replace('_', ' ')} {q}" for k, q in (job.get("resources") or {}).items()]
        if job.get("shm_size"):
            per_replica.append(f"/dev/shm {job['shm_size']}")
        if per_replica:  # after the GPUs
            lines.insert(3, f"  Replica   {', '.join(per_replica)} (requests = limits)")
        topology = job.get("topology")
        if isinstance(topology, dict):
            lines.append(f"  Topology  one {topology.get('level')} ({topology.get('mode')})")
        lines += _workload_lines(job)
        lines += _checkpoint_lines(job, self.stamp)
        lines += _cluster_lines(job)
        if job.get("placement"):
            lines.append(f"  Nodes     {_nodes(job['placement'], sep=', ')}")
        if job.get("message"):
            lines.append(f"  Message   {job['message']}")
        queue = job.get("queue")
        if queue:
            lines.append(f"  Queue     position {queue.get('position')} of {queue.get('queued')}, "
                         f"{queue.get('ahead')} ahead")
            lines += [f"  Waiting   {r['message']}" for r in queue.get("reasons", [])]
        self.say("\n".join(lines))
        events = job.get("events") or []
        if events:
            self.say("")
            self.say(table([[self.stamp(e["at"]), e["kind"],
                             f"{e['from_status'] or '-'} -> {e['to_status'] or '-'}",
                             e["actor"], e["reason"]] for e in events],
                           ["AT", "EVENT", "TRANSITION", "BY", "REASON"]))
        return 0

    # fairq cancel ID
    def cancel(self, a: argparse.Namespace) -> int:
        if not a.job_ids and a.array is None:
            raise UsageError("cancel wants job IDs or --array ID")
        if a.array is not None:
            done = self.client.request("DELETE", f"/arrays/{a.array}/")
            if self.as_json:
                self.emit_json(done)
            else:
                # Members the server had not queued as jobs yet are cancelled too.
                rest = done.get("cancelled_not_written") or 0
                self.say(f"Cancelled {len(done['cancelled']) + rest} job(s) of array {a.array}"
                         f"{f' ({rest} not started as jobs yet)' if rest else ''}")
        refused = 0
        for job_id in a.job_ids:
            try:
                job = self.client.post(f"/jobs/{job_id}/cancel/")
            except ApiError as exc:
                # As scancel: one refusal does not keep the other jobs running; each is
                # one line on stderr naming its job, and the exit says some were refused.
                if exc.code == "unreachable" or len(a.job_ids) == 1:
                    raise
                self.err.write(f"fairq: job {job_id}: {exc.message}\n")
                refused += 1
                continue
            if self.as_json:
                self.emit_json(job)
            else:
                self.say(f"Cancelled job {job['id']} ({job['name']})")
        return EXIT_SERVER_SAID_NO if refused else 0

    # fairq logs ID [--attempt N] [--replica R] [-f]
    def logs(self, a: argparse.Namespace) -> int:
        """The log's lines on stdout; what fairq says about it ("[fairq] ..." lines: an
        empty log, no logs yet, how the attempt ended, the other attempts) on stderr, so
        that `fairq logs 12 > out.txt` keeps only the job's own lines."""
        query = {"attempt": a.attempt, "replica": a.replica}
        if not a.follow:
            data = self.client.get(f"/jobs/{a.job_id}/logs/", tail=a.tail, **query)
            if self.as_json:
                self.emit_json(data)
            else:
                for line in data["lines"]:
                    self.say(line)
                self._log_notes(data)
            return 0
        # Follow: read the tail and print what is new; a new attempt starts over.
        printed, attempt, empty_said = 0, None, False
        watcher = Watcher(self, give_up=a.unreachable_timeout, deadline=None,
                          seconds=_watch_seconds(), verbose=False)
        while True:
            data = watcher.get(f"/jobs/{a.job_id}/logs/", {
                "tail": 10_000, **{k: v for k, v in query.items() if v is not None}})[1]
            if data["attempt"] != attempt:
                attempt, printed, empty_said = data["attempt"], 0, False
            lines = data["lines"]
            if len(lines) < printed:  # the cluster trimmed its buffer: print what we have
                printed = 0
            for line in lines[printed:]:
                self.say(json.dumps({"attempt": attempt, "line": line}) if self.as_json else line)
            printed = len(lines)
            if data["status"] in FINAL or (a.attempt is not None and data.get("exit")):
                if not self.as_json:
                    self._log_notes(data)
                return 0
            if not lines and not empty_said and not self.as_json and \
                    (data.get("empty") or data.get("note")):
                said = data.get("note") or "the log is empty"
                self.err.write(f"[fairq] attempt {attempt}: {said} (following)\n")
                empty_said = True
            self.out.flush()
            # The watch: back at once when the job changes (ends, requeues), else after
            # the interval, to read the lines written meanwhile.
            watcher.pause(a.job_id, seconds=max(1, round(a.poll_interval)))

    def _log_notes(self, data: dict[str, Any]) -> None:
        where = f"attempt {data.get('attempt')}"
        if data.get("replicas", 1) > 1:
            where += f", replica {data.get('replica')}"
        if data.get("note"):
            self.err.write(f"[fairq] {where}: {data['note']}\n")
        elif data.get("empty"):
            self.err.write(f"[fairq] {where}: the log is empty\n")
        if data.get("exit"):
            self.err.write(f"[fairq] {where} ended: {data['exit']}\n")
        others = [f"{x['attempt']}" for x in data.get("attempts") or []
                  if x.get("attempt") != data.get("attempt")]
        if others:
            self.err.write(f"[fairq] other attempts with logs: {', '.join(others)} "
                           "(--attempt N)\n")

    # fairq share [-a]
    def share(self, a: argparse.Namespace) -> int:
        data = self.client.get("/fairshare/", users=1 if a.all_users else None)
        teams = data["teams"] if isinstance(data, dict) else data
        if self.as_json:
            self.emit_json(data)
            return 0
        rows: list[list[Any]] = []
        for t in teams:
            rows.append([t["team"], "", t.get("parent") or "", _num(t.get("weight")),
                         _num(t.get("share"), 4), _num(t.get("usage_gpu_hours"), 2),
                         _num(t.get("normalized_usage"), 4), _num(t.get("fair_share_factor"), 4),
                         ""])
            for u in (t.get("users") or []) if a.all_users else []:
                rows.append(["", u.get("user") or "(imported)", "", "", "",
                             _num(u.get("usage_gpu_hours"), 2), _num(u.get("usage_fraction"), 4),
                             "", u.get("running_jobs", 0)])
        headers = ["TEAM", "USER", "PARENT", "WEIGHT", "NORMSHARES", "GPU-HOURS", "NORMUSAGE",
                   "FAIRSHARE", "RUNNING"]
        if not a.all_users:  # the columns of `sshare` without -a
            headers = [h for h in headers if h not in {"USER", "RUNNING"}]
            rows = [[r[0], *r[2:8]] for r in rows]
        self.say(table(rows, headers))
        return 0

    # fairq acct
    def acct(self, a: argparse.Namespace) -> int:
        params: list[tuple[str, Any]] = []
        for key in ("team", "user", "gpu_type"):
            if getattr(a, key):
                params.append((key, getattr(a, key)))
        if a.start:
            params.append(("from", instant_arg(a.start, "--start", self.zone)))
        if a.end:
            params.append(("to", instant_arg(a.end, "--end", self.zone)))
        if a.state:
            params.append(("state", ",".join(s.strip().upper() for s in a.state.split(","))))
        params.append(("page_size", min(max(a.limit, 1), 500)))
        rows = self.client.pages("/accounting/", params, a.limit)
        if self.as_json:
            self.emit_json(rows)
            return 0
        out = []
        for r in rows:
            eff = r.get("efficiency")
            out.append([f"{r['job_id']}.{r['attempt']}", r["name"][:20], r.get("user") or "",
                        r["team"], r["tier"], f"{r['gpus']}x{r['gpu_type']}",
                        self.stamp(r["start"]), self.stamp(r.get("end")) or "Unknown",
                        hms(r["elapsed_seconds"]), _num(r["gpu_hours"], 2), r["state"],
                        "" if r.get("exit_code") is None else r["exit_code"],
                        "" if eff is None else f"{eff * 100:.1f}%"])
        self.say(table(out, ["JOBID", "JOBNAME", "USER", "TEAM", "TIER", "ALLOCGPUS", "START",
                             "END", "ELAPSED", "GPU-HOURS", "STATE", "EXITCODE", "GPUEFF"]))
        return 0

    # fairq prio ID
    def prio(self, a: argparse.Namespace) -> int:
        if not a.job_ids:
            return self.prio_pending(a)
        jobs = [self.client.get(f"/jobs/{job_id}/") for job_id in a.job_ids]
        if self.as_json:
            self.emit_json([{"id": j["id"], "tier": j["tier"], "priority": j.get("priority"),
                             "queue": j.get("queue")} for j in jobs])
            return 0
        rows = []
        for j in jobs:
            p = j.get("priority")
            if not p:
                raise ApiError("the server reports no priority breakdown for jobs")
            rows.append(_prio_row(j["id"], j["team"], j["tier"], j["status"], p))
        self.say(table(rows, ["JOBID", "TEAM", "TIER", "STATE", "PRIORITY", "FAIRSHARE", "AGE",
                              "SIZE"]))
        if len(jobs) == 1:
            p = jobs[0]["priority"]
            self.say("")
            self.say(table([[k, _num(v.get("factor"), 4), _num(v.get("weight"), 0),
                             _num(v.get("value"), 1)] for k, v in p.get("factors", {}).items()],
                           ["FACTOR", "VALUE", "WEIGHT", "WEIGHTED"]))
            queue = jobs[0].get("queue")
            if queue:
                self.say("")
                self.say(f"Queue position {queue.get('position')} of {queue.get('queued')} "
                         f"({queue.get('ahead')} ahead)")
                for r in queue.get("reasons", []):
                    self.say(f"  {r['code']}: {r['message']}")
        return 0

    def prio_pending(self, a: argparse.Namespace) -> int:
        """`sprio` with no job: every pending job the caller can see (of `-t`), in queue
        order (rule P2), with its position and priority per factor (rule P1), from one
        request (`GET /jobs/starts/?priority=1`)."""
        data = self.client.get("/jobs/starts/", team=a.team, priority=1)
        jobs = data["jobs"]
        if self.as_json:
            self.emit_json([{"id": j["id"], "team": j.get("team"), "tier": j.get("tier"),
                             "position": j.get("position"), "priority": j.get("priority")}
                            for j in jobs])
            return 0
        if not jobs:
            self.err.write("fairq: no pending jobs\n")
            return 0
        rows = [[j.get("position") or "", *_prio_row(j["id"], j.get("team") or "",
                                                    j.get("tier") or "", "QUEUED",
                                                    j.get("priority") or {})]
                for j in jobs]
        self.say(table([[r[1], r[2], r[3], r[0], *r[5:]] for r in rows],
                       ["JOBID", "TEAM", "TIER", "POS", "PRIORITY", "FAIRSHARE", "AGE", "SIZE"]))
        if data.get("error"):
            self.err.write(f"fairq: no queue positions: {data['error']}\n")
        return 0


def _goes_on(status: str) -> str:
    """What a job not ended does without the CLI watching it."""
    if status in {"ADMITTED", "RUNNING"}:
        return "it is still running, this command only stopped watching"
    if status == "PREEMPTED":
        return "it goes back to the queue, this command only stopped watching"
    return "it is still queued, this command only stopped watching"


def _prio_row(job_id: int, team: str, tier: str, status: str, p: dict[str, Any]) -> list[Any]:
    f = p.get("factors", {})
    return [job_id, team, tier, status, _num(p.get("total"), 1)] + \
        [_num(f.get(k, {}).get("value"), 1) for k in ("fair_share", "age", "size")]


def _queue_order(job: dict[str, Any]) -> tuple[int, int, int]:
    """Running and admitted jobs first, then the queue by position (rule P2), then the
    rest; by id within each."""
    if job["status"] == "QUEUED":
        position = job.get("position")
        return (1, position if isinstance(position, int) else 1 << 30, job["id"])
    return (0 if job["status"] in {"ADMITTED", "RUNNING", "PREEMPTED"} else 2, 0, job["id"])


def _workload_lines(job: dict[str, Any]) -> list[str]:
    """`fairq status`'s lines of a job's volumes, secrets, pull secret, working dir,
    labels, annotations and grace period (none for what the job does not set)."""
    lines = []
    for v in job.get("volumes") or []:
        if "pvc" in v:
            what = f"pvc {v['pvc']}{' (read-only)' if v.get('read_only') else ''}"
        else:
            what = f"scratch {(v.get('empty_dir') or {}).get('size_limit')}"
        lines.append(f"  Volume    {v.get('name')}: {what} at {v.get('mount_path')}")
    for ref in job.get("secrets") or []:
        if "env" in ref:
            lines.append(f"  Secret    {ref['secret']}[{ref.get('key')}] as ${ref['env']}")
        else:
            lines.append(f"  Secret    {ref['secret']} at {ref.get('mount_path')} (read-only)")
    if job.get("image_pull_secret"):
        lines.append(f"  Pull      {job['image_pull_secret']}")
    if job.get("working_dir"):
        lines.append(f"  Workdir   {job['working_dir']}")
    for title, key in (("Labels", "labels"), ("Notes", "annotations")):
        if job.get(key):
            pairs = ", ".join(f"{k}={val}" for k, val in sorted(job[key].items()))
            lines.append(f"  {title:<9} {pairs}")
    if job.get("termination_grace_seconds") is not None:
        lines.append(f"  Grace     {job['termination_grace_seconds']}s")
    return lines


def _checkpoint_lines(job: dict[str, Any], stamp: Callable[[Any], str]) -> list[str]:
    """`fairq status`'s lines of the graceful stop: the stop signal, the declared
    checkpoint interval, the newest checkpoint, and what each preemption lost."""
    lines = []
    signal = job.get("stop_signal") or "SIGTERM"
    grace = job.get("termination_grace_seconds")
    lines.append(f"  Stop      {signal}, then SIGKILL"
                 + (f" after {grace}s" if grace is not None else " after the grace"))
    every = job.get("checkpoint_interval_seconds")
    c = job.get("checkpoint")
    if every or c:
        text = f"every {format_duration(int(every))}" if every else "interval not declared"
        if isinstance(c, dict):
            said = [f"step {c['step']}" if c.get("step") is not None else "",
                    f"{c['progress'] * 100:.0f}%" if c.get("progress") is not None else "",
                    str(c.get("path") or "")]
            detail = ", ".join(x for x in said if x)
            text += (f"; newest {stamp(c.get('created_at'))} (attempt {c.get('attempt')}"
                     + (f": {detail}" if detail else "") + ")")
        else:
            text += "; none reported yet"
        lines.append(f"  Checkpt   {text}")
    notes = [a for a in job.get("attempts") or [] if a.get("lost_note")]
    for a in notes:
        lines.append(f"  Attempt {a['attempt']} {a['lost_note']}")
    if notes:
        lines.append(f"  Lost      {float(job.get('lost_gpu_hours') or 0.0):.2f} GPU-h to "
                     f"{len(notes)} preemption(s)")
    return lines


def checkpoint_report(a: argparse.Namespace, *, transport: Transport | None, out: TextIO,
                      err: TextIO) -> int:
    """`fairq checkpoint`, run inside a job: POST the checkpoint to FAIRQ_CHECKPOINT_URL
    with FAIRQ_CHECKPOINT_TOKEN (what fairq put in the job's pods; no config file)."""
    url = os.environ.get("FAIRQ_CHECKPOINT_URL", "").strip()
    token = os.environ.get("FAIRQ_CHECKPOINT_TOKEN", "").strip()
    missing = [n for n, v in (("FAIRQ_CHECKPOINT_URL", url), ("FAIRQ_CHECKPOINT_TOKEN", token))
               if not v]
    if missing:
        err.write(f"fairq: {' and '.join(missing)} not set: `fairq checkpoint` runs inside "
                  "a job fairq started, and fairq offers reporting only when its "
                  "FAIRQ_PUBLIC_URL is set (docs/cli.md, \"fairq checkpoint\")\n")
        return EXIT_USAGE
    if a.progress is not None and not 0.0 <= a.progress <= 1.0:
        err.write(f"fairq: --progress wants a number within 0..1, not {a.progress}\n")
        return EXIT_USAGE
    body = {k: v for k, v in (("step", a.step), ("progress", a.progress), ("path", a.path))
            if v is not None}
    client = Client(url.split("/api/v1/", 1)[0] or url, token, transport=transport)
    client.headers["Authorization"] = f"Bearer {token}"
    try:
        saved = client.post(url, body)
    except ApiError as exc:
        err.write(f"fairq: {exc.message}\n")
        return EXIT_UNREACHABLE if exc.code == "unreachable" else EXIT_SERVER_SAID_NO
    if a.json:
        out.write(json.dumps(saved, indent=2) + "\n")
    else:
        out.write(f"checkpoint {saved.get('id')} of job {saved.get('job')} attempt "
                  f"{saved.get('attempt')} recorded\n")
    return 0


def _cluster_lines(job: dict[str, Any]) -> list[str]:
    """`fairq status`'s cluster lines (rules K1, K3, K4): where it runs, its pin, selector
    and spot opt-in; none for a job of a server without clusters or that set none."""
    lines = []
    if job.get("cluster"):
        lines.append(f"  Cluster   {job['cluster']}")
    wants = []
    if job.get("requested_cluster"):
        wants.append(f"pinned to {job['requested_cluster']}")
    if job.get("cluster_selector"):
        wants.append("clusters with " + ", ".join(
            f"{k}={v}" for k, v in sorted(job["cluster_selector"].items())))
    if job.get("allow_spot"):
        wants.append("may run on spot nodes")
    if wants:
        lines.append(f"  Placement {'; '.join(wants)}")
    return lines


def _nodes(placement: Sequence[Any], *, sep: str = ",") -> str:
    """A job's placement (one node per replica) as people read it: each node once, in
    order, with how many replicas it holds when more than one ("n1 (2 replicas)")."""
    counts: dict[str, int] = {}
    for node in map(str, placement):
        counts[node] = counts.get(node, 0) + 1
    return sep.join(f"{node} ({n} replicas)" if n > 1 else node for node, n in counts.items())


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return ""
    if isinstance(value, float | int):
        return f"{value:.{digits}f}"
    return str(value)


def _quantity_text(value: Any) -> Any:
    """A YAML number as the quantity it was written as (4 -> "4"); anything else as is,
    for the server to judge."""
    if isinstance(value, bool):
        return value
    return str(value) if isinstance(value, int | float) else value


def job_from_args(a: argparse.Namespace) -> dict[str, Any]:
    """A job body from the YAML file (if any), overridden by flags."""
    body: dict[str, Any] = {}
    if a.file:
        try:
            loaded = yaml.safe_load(Path(a.file).read_text()) if a.file != "-" else \
                yaml.safe_load(sys.stdin.read())
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"cannot read job file {a.file}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise UsageError(f"job file {a.file} must hold a mapping of job fields")
        unknown = sorted(set(loaded) - set(JOB_FIELDS) - set(FILE_DURATIONS))
        if unknown:
            raise UsageError(f"unknown fields in {a.file}: {', '.join(unknown)}")
        for name, field in FILE_DURATIONS.items():
            if name in loaded:
                loaded[field] = duration_seconds(str(loaded.pop(name)))
        body.update(loaded)
        # YAML reads `cpu: 4` and `cpu: 0.5` as numbers: quantities are strings.
        if isinstance(body.get("resources"), dict):
            body["resources"] = {k: _quantity_text(v) for k, v in body["resources"].items()}
        if "shm_size" in body:
            body["shm_size"] = _quantity_text(body["shm_size"])
    for key in ("team", "name", "image", "gpu_type", "gpus", "replicas", "tier"):
        if getattr(a, key) is not None:
            body[key] = getattr(a, key)
            if key == "gpu_type":
                body.pop("gpu_types", None)  # the flag replaces the file's types
    _several_types(body)
    if a.time:
        body["max_runtime_seconds"] = duration_seconds(a.time)
    flags = {key: getattr(a, dest) for dest, key in RESOURCE_FLAGS.items()
             if getattr(a, dest) is not None}
    if flags:
        resources = body.get("resources")
        body["resources"] = {**(resources if isinstance(resources, dict) else {}), **flags}
    if a.shm_size is not None:
        body["shm_size"] = a.shm_size
    if a.topology is not None:
        level, _, mode = a.topology.partition(":")
        if not level:
            raise UsageError(f"--topology wants LEVEL[:required|preferred], not {a.topology!r}")
        body["topology"] = {"level": level, "mode": mode or "required"}
    _workload_flags(a, body)
    if a.cluster is not None:
        body["requested_cluster"] = a.cluster
    if a.cluster_selector:
        selector = body.get("cluster_selector")
        body["cluster_selector"] = {**(selector if isinstance(selector, dict) else {}),
                                    **_pairs(a.cluster_selector, "--cluster-selector")}
    if a.allow_spot:
        body["allow_spot"] = True
    if a.env:
        env = dict(body.get("env") or {})
        for item in a.env:
            if "=" not in item:
                raise UsageError(f"--env wants NAME=VALUE, not {item!r}")
            k, v = item.split("=", 1)
            env[k] = v
        body["env"] = env
    cmd = list(a.command or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if cmd:
        body["command"] = cmd
    missing = [k for k in ("team", "name", "image", "gpu_type", "gpus") if k not in body
               and not (k == "gpu_type" and "gpu_types" in body)]
    if missing:
        raise UsageError(f"missing {', '.join(missing)} (give flags or a job file with -f)")
    return body


def _several_types(body: dict[str, Any]) -> None:
    """`-G h100,a100` (or `gpu_type: h100,a100` in a job file): the GPU types the job
    accepts, most preferred first, sent as `gpu_types`; one type stays `gpu_type`."""
    given = body.get("gpu_type")
    if isinstance(given, str) and "," in given:
        types = [t.strip() for t in given.split(",")]
        if not all(types):
            raise UsageError(f"-G wants TYPE or TYPE,TYPE,... (most preferred first), "
                             f"not {given!r}")
        del body["gpu_type"]
        body["gpu_types"] = types


def gpus_arg(text: str) -> int | float | str:
    """`--gpus`: a whole number (2), a decimal fraction (0.25) or k/n (1/4, sent as it is:
    the server says whether the GPU type takes it)."""
    value = text.strip()
    if re.fullmatch(r"[0-9]{1,6}", value):
        return int(value)
    if re.fullmatch(r"[0-9]{0,6}\.[0-9]{1,9}", value):
        return float(value)
    if re.fullmatch(r"[0-9]{1,6}/[1-9][0-9]{0,2}", value):
        return value
    raise argparse.ArgumentTypeError(
        f"{text!r}: want whole GPUs (2) or a fraction of one GPU (0.5, 0.25, 1/4)")


def fraction_text(job: dict[str, Any]) -> str:
    """A fraction of a shared GPU as people read it: "0.5 GPU (2 of 4 slices,
    time-sliced)"; "" for whole GPUs."""
    slices = job.get("gpu_slices") or 0
    if not slices:
        return ""
    return (f"{job['gpus']:g} GPU ({slices} of {job.get('slices_per_gpu')} slices, "
            f"{job.get('gpu_sharing')})")


def gpus_text(job: dict[str, Any]) -> str:
    """"2xh100", or while a job of several GPU types waits, "2xh100|a100" (once admitted,
    `gpu_type` is the type chosen); a fraction "0.5xts-a10"."""
    if job.get("gpu_slices"):
        return f"{job['gpus']:g}x{job['gpu_type']}"
    types = job.get("gpu_types") or []
    if job.get("status") == "QUEUED" and len(types) > 1:
        return f"{job['gpus']}x{'|'.join(types)}"
    return f"{job['gpus']}x{job['gpu_type']}"


def _pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} wants KEY=VALUE, not {item!r}")
        out[key] = value
    return out


def _volume_flag(item: str) -> dict[str, Any]:
    """`--volume NAME=pvc:CLAIM:/PATH[:ro]` as the API's volume."""
    name, sep, rest = item.partition("=")
    parts = rest.split(":")
    if not sep or len(parts) not in (3, 4) or parts[0] != "pvc" or \
            (len(parts) == 4 and parts[3] not in ("ro", "rw")):
        raise UsageError(f"--volume wants NAME=pvc:CLAIM:/PATH[:ro], not {item!r}")
    volume: dict[str, Any] = {"name": name, "pvc": parts[1], "mount_path": parts[2]}
    if len(parts) == 4:
        volume["read_only"] = parts[3] == "ro"
    return volume


def _scratch_flag(item: str) -> dict[str, Any]:
    """`--scratch NAME=SIZE:/PATH` as the API's emptyDir volume."""
    name, sep, rest = item.partition("=")
    size, colon, path = rest.partition(":")
    if not sep or not colon:
        raise UsageError(f"--scratch wants NAME=SIZE:/PATH (e.g. scratch=100Gi:/scratch), "
                         f"not {item!r}")
    return {"name": name, "empty_dir": {"size_limit": size}, "mount_path": path}


def _secret_env_flag(item: str) -> dict[str, Any]:
    """`--secret-env ENV=SECRET:KEY` as the API's secret env reference."""
    env, sep, rest = item.partition("=")
    secret, colon, key = rest.partition(":")
    if not sep or not colon:
        raise UsageError(f"--secret-env wants ENV=SECRET:KEY (e.g. HF_TOKEN=hf-token:token), "
                         f"not {item!r}")
    return {"secret": secret, "key": key, "env": env}


def _secret_volume_flag(item: str) -> dict[str, Any]:
    """`--secret-volume SECRET:/PATH` as the API's secret files reference."""
    secret, colon, path = item.partition(":")
    if not colon:
        raise UsageError(f"--secret-volume wants SECRET:/PATH, not {item!r}")
    return {"secret": secret, "mount_path": path}


def _workload_flags(a: argparse.Namespace, body: dict[str, Any]) -> None:
    """The storage, secret and metadata flags onto `body`: volumes and secrets after the
    job file's, labels and annotations over its keys, the rest replacing it."""
    volumes = [_volume_flag(i) for i in a.volume or []] + \
        [_scratch_flag(i) for i in a.scratch or []]
    if volumes:
        body["volumes"] = [*(body.get("volumes") or []), *volumes]
    secrets = [_secret_env_flag(i) for i in a.secret_env or []] + \
        [_secret_volume_flag(i) for i in a.secret_volume or []]
    if secrets:
        body["secrets"] = [*(body.get("secrets") or []), *secrets]
    for key, items, flag in (("labels", a.label, "--label"),
                             ("annotations", a.annotation, "--annotation")):
        if items:
            given = body.get(key)
            body[key] = {**(given if isinstance(given, dict) else {}), **_pairs(items, flag)}
    if a.pull_secret is not None:
        body["image_pull_secret"] = a.pull_secret
    if a.workdir is not None:
        body["working_dir"] = a.workdir
    if a.grace is not None:
        body["termination_grace_seconds"] = duration_seconds(a.grace)
    if a.stop_signal is not None:
        signal = a.stop_signal.upper()
        signal = signal if signal.startswith("SIG") else f"SIG{signal}"
        if signal not in STOP_SIGNALS:
            raise UsageError(f"--stop-signal wants one of {', '.join(STOP_SIGNALS)}, "
                             f"not {a.stop_signal!r}")
        body["stop_signal"] = signal
    if a.checkpoint_every is not None:
        body["checkpoint_interval_seconds"] = duration_seconds(a.checkpoint_every)


# --- argument parsing --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    def common_args(suppress: bool) -> argparse.ArgumentParser:
        # Sub-commands repeat the options without defaults, so `fairq --json queue` and
        # `fairq queue --json` both work (a sub-parser default would overwrite the first).
        kw: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
        c = argparse.ArgumentParser(add_help=False)
        c.add_argument("--url", help="server URL (env FAIRQ_URL, or url in the config file)", **kw)
        c.add_argument("--token", help="API token (env FAIRQ_TOKEN, or token in the config file)",
                       **kw)
        c.add_argument("--profile", help="a [profiles.NAME] section of the config file", **kw)
        c.add_argument("--json", action="store_true", help="machine-readable output", **kw)
        c.add_argument("--utc", action="store_true", help="times in UTC (2026-10-01T08:00:00Z) "
                       "rather than your zone (env FAIRQ_UTC=1, or utc = true in the config "
                       "file)", **kw)
        return c

    common = common_args(suppress=True)
    p = argparse.ArgumentParser(prog="fairq", description=__doc__.splitlines()[0],
                                parents=[common_args(suppress=False)])
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    s = sub.add_parser("submit", parents=[common], help="submit a job (like sbatch)")
    s.add_argument("-f", "--file", help="a YAML job file ('-' for stdin); flags override it")
    s.add_argument("-t", "--team")
    s.add_argument("-J", "--name")
    s.add_argument("-i", "--image")
    s.add_argument("-G", "--gpu-type", dest="gpu_type",
                   help="the GPU type, or the types it accepts, most preferred first: "
                        "h100,a100")
    s.add_argument("-g", "--gpus", type=gpus_arg,
                   help="GPUs per replica: 2, or on a time-sliced or MPS GPU type a fraction "
                        "of one GPU, a multiple of 1/slices per GPU: 0.5, 0.25, 1/4 (NO "
                        "memory isolation between the jobs sharing the GPU)")
    s.add_argument("-N", "--replicas", type=int, help="gang size (all start together)")
    s.add_argument("-q", "--tier")
    s.add_argument("--time", help="max runtime: 90, 30m, 2h, 1h30m, 1d or h:mm:ss")
    s.add_argument("-e", "--env", action="append", metavar="NAME=VALUE")
    s.add_argument("--cpu", help="CPUs per replica: 4, 500m (requests = limits)")
    s.add_argument("--memory", help="memory per replica: 16Gi, 500M")
    s.add_argument("--ephemeral-storage", dest="ephemeral_storage",
                   help="ephemeral (node-local) storage per replica: 50Gi")
    s.add_argument("--shm-size", dest="shm_size", help="size of /dev/shm: 8Gi")
    s.add_argument("--topology", metavar="LEVEL[:MODE]",
                   help="all replicas in one domain of a topology level of the GPU type: "
                        "rack:required (the default mode) or rack:preferred")
    s.add_argument("--volume", action="append", metavar="NAME=pvc:CLAIM:/PATH[:ro]",
                   help="mount a PersistentVolumeClaim of the team's namespace (one the "
                        "team allows), e.g. data=pvc:imagenet:/data:ro; repeatable")
    s.add_argument("--scratch", action="append", metavar="NAME=SIZE:/PATH",
                   help="node-local scratch (an emptyDir of at most SIZE), e.g. "
                        "scratch=100Gi:/scratch; repeatable")
    s.add_argument("--secret-env", dest="secret_env", action="append",
                   metavar="ENV=SECRET:KEY",
                   help="an env var from a key of a Secret the team allows, e.g. "
                        "HF_TOKEN=hf-token:token (the value never passes through fairq); "
                        "repeatable")
    s.add_argument("--secret-volume", dest="secret_volume", action="append",
                   metavar="SECRET:/PATH",
                   help="a Secret's keys as read-only files under PATH, e.g. "
                        "wandb:/etc/wandb; repeatable")
    s.add_argument("--pull-secret", dest="pull_secret", metavar="SECRET",
                   help="an image pull secret the team allows")
    s.add_argument("--workdir", help="the container's working directory (absolute)")
    s.add_argument("--label", action="append", metavar="KEY=VALUE",
                   help="a label of the job (on its pods as user.fairq.io/KEY; "
                        "`fairq queue --label` filters on it); repeatable")
    s.add_argument("--annotation", action="append", metavar="KEY=VALUE",
                   help="an annotation of the job (on its pods as user.fairq.io/KEY); "
                        "repeatable")
    s.add_argument("--grace", metavar="SECONDS",
                   help="termination grace when stopped: 120, 2m (at most the tier's cap)")
    s.add_argument("--stop-signal", dest="stop_signal", metavar="SIGNAL",
                   help="the signal the job gets first when preempted or cancelled (then "
                        "SIGKILL after the grace): SIGTERM (default), SIGINT, SIGUSR1, "
                        "SIGUSR2, SIGHUP")
    s.add_argument("--checkpoint-every", dest="checkpoint_every", metavar="DURATION",
                   help="how often the job checkpoints: 30m, 1h, 600 (at least 60 s); it "
                        "reports each with `fairq checkpoint`")
    s.add_argument("--cluster", metavar="NAME",
                   help="run only in this cluster (rule K3; `fairq clusters` lists them)")
    s.add_argument("--cluster-selector", dest="cluster_selector", action="append",
                   metavar="KEY=VALUE",
                   help="run only in clusters with this label (repeatable: all must match)")
    s.add_argument("--allow-spot", dest="allow_spot", action="store_true",
                   help="a non-preemptible tier's job may run on spot nodes (rule K4)")
    s.add_argument("-a", "--array", type=array_arg, metavar="N[%M]|INDICES[%M]",
                   help="submit N copies (job i gets FAIRQ_ARRAY_INDEX=i), or one per index "
                        "as Slurm writes them (0-99, 1,3,5, 0-15:4, combined with commas); "
                        "%%M: at most M holding GPUs at once")
    s.add_argument("-d", "--dependency", metavar="TYPE:ID[:ID][,...]",
                   help="wait for jobs of the team (Slurm's syntax: afterok:12:13,afterany:14;"
                        " a<ID> names a whole array: afterok:a7)")
    s.add_argument("-W", "--wait", action="store_true",
                   help="follow the job (with -a: every member) to its end; exit 0 when it "
                        "succeeded, 3 failed, 4 cancelled, 6 --timeout, 7 fairq unreachable "
                        "too long (the job goes on)")
    s.add_argument("--poll-interval", type=float, default=2.0,
                   help=argparse.SUPPRESS)  # before the watch; accepted, unused
    s.add_argument("--timeout", type=float, default=None, help="give up waiting after seconds")
    s.add_argument("--unreachable-timeout", type=float, metavar="SECONDS",
                   default=os.environ.get("FAIRQ_UNREACHABLE_TIMEOUT") or "300",
                   help="with --wait: retry an unreachable fairq this long before exit 7 "
                        "(default 300, env FAIRQ_UNREACHABLE_TIMEOUT)")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")

    q = sub.add_parser("queue", parents=[common], help="list jobs (like squeue)")
    q.add_argument("-t", "--team")
    q.add_argument("-u", "--user", help="jobs submitted by this user")
    q.add_argument("-q", "--tier")
    q.add_argument("-G", "--gpu-type", dest="gpu_type")
    q.add_argument("-n", "--name", help="name contains")
    q.add_argument("-s", "--state", help="comma-separated states (default: active ones)")
    q.add_argument("-A", "--all", action="store_true", help="include finished jobs")
    q.add_argument("-l", "--label", action="append", metavar="KEY=VALUE",
                   help="jobs with this label; repeat for several (all must match)")
    q.add_argument("-M", "--cluster", help="jobs running in this cluster (like squeue -M)")
    q.add_argument("--limit", type=int, default=200)
    q.add_argument("--start", action="store_true",
                   help="queued jobs only, with their position and estimated start time "
                        "(N/A when none can be estimated; like squeue --start)")

    sub.add_parser("clusters", parents=[common],
                   help="clusters with capacity and free GPUs per type (like sinfo)")

    qt = sub.add_parser("quota-tree", parents=[common],
                        help="quotas as a tree: departments, their teams, held, borrowing, "
                             "lent and available per GPU type")
    qt.add_argument("-G", "--gpu-type", dest="gpu_type", help="only this GPU type")

    st = sub.add_parser("status", parents=[common], aliases=["show"],
                        help="one job in detail, with its events (alias: show)")
    st.add_argument("job_id", type=int)

    ck = sub.add_parser(
        "checkpoint", parents=[common],
        help="inside a job: report a checkpoint (reads FAIRQ_CHECKPOINT_URL and "
             "FAIRQ_CHECKPOINT_TOKEN)")
    ck.add_argument("--step", type=int, help="the training step it saved, e.g. 1200")
    ck.add_argument("--progress", type=float, help="how far the job is, 0..1 (0.4: 40%%)")
    ck.add_argument("--path", help="where it wrote it, e.g. /ckpt/step-1200.pt")

    c = sub.add_parser("cancel", parents=[common], help="cancel jobs (like scancel)")
    c.add_argument("job_ids", type=int, nargs="*", metavar="ID")
    c.add_argument("--array", type=int, metavar="ID",
                   help="cancel every member of array ID that has not ended")

    lg = sub.add_parser("logs", parents=[common], help="a job's logs")
    lg.add_argument("job_id", type=int)
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until it ends")
    lg.add_argument("--tail", type=int, default=100)
    lg.add_argument("--attempt", type=int, help="which attempt (default: the current one)")
    lg.add_argument("--replica", type=int, help="which replica (default: 0)")
    lg.add_argument("--poll-interval", type=float, default=2.0,
                    help="with -f: read new lines this often (seconds; the job's end is "
                         "seen at once)")
    lg.add_argument("--unreachable-timeout", type=float, metavar="SECONDS",
                    default=os.environ.get("FAIRQ_UNREACHABLE_TIMEOUT") or "300",
                    help=argparse.SUPPRESS)

    sh = sub.add_parser("share", parents=[common], help="fair-share standings (like sshare)")
    sh.add_argument("-a", "--all", dest="all_users", action="store_true",
                    help="also each team's users and their usage (like sshare -a)")

    ac = sub.add_parser("acct", parents=[common],
                        help="job attempts: elapsed, GPU-hours, exit, efficiency (like sacct)")
    ac.add_argument("-t", "--team")
    ac.add_argument("-u", "--user", help="attempts of jobs this user submitted")
    ac.add_argument("-S", "--start", help="attempts running at or after this time "
                    "(2026-10-01, 2026-10-01T08:00 in your zone or --utc, or with an offset)")
    ac.add_argument("-E", "--end", help="attempts that started before this time")
    ac.add_argument("-s", "--state", help="comma-separated: RUNNING, SUCCEEDED, FAILED, "
                    "CANCELLED, PREEMPTED, REQUEUED")
    ac.add_argument("-G", "--gpu-type", dest="gpu_type")
    ac.add_argument("--limit", type=int, default=200)

    add_session_parser(sub, common)
    add_reservation_parser(sub, common)

    pr = sub.add_parser("prio", parents=[common], help="priority breakdown (like sprio)")
    pr.add_argument("job_ids", type=int, nargs="*", metavar="ID",
                    help="jobs to break down (none: every pending job you can see)")
    pr.add_argument("-t", "--team", help="with no ID: the pending jobs of this team")
    return p


def main(argv: Sequence[str] | None = None, *, transport: Transport | None = None,
         out: TextIO | None = None, err: TextIO | None = None,
         sleep: Callable[[float], None] = time.sleep) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        code = _main(argv, transport=transport, out=out, err=err, sleep=sleep)
        out.flush()
        return code
    except BrokenPipeError:
        # `fairq status 12 | head -3`: the reader left. Exit quietly as a Unix tool
        # killed by SIGPIPE would (128 + 13), with nothing left to flush at exit.
        for stream in (out, err):
            _quiet(stream)
        return EXIT_BROKEN_PIPE


def _quiet(stream: TextIO) -> None:
    """Point `stream`'s file at /dev/null when it is a pipe nobody reads any more, so
    the interpreter's last flush cannot fail again."""
    try:
        stream.flush()
    except BrokenPipeError:
        try:
            fd = stream.fileno()
        except (OSError, ValueError):
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except (OSError, ValueError):
        return


def _main(argv: Sequence[str] | None, *, transport: Transport | None, out: TextIO,
          err: TextIO, sleep: Callable[[float], None]) -> int:
    parser = build_parser()
    try:
        a = parser.parse_args(argv)
    except SystemExit as exc:  # argparse printed the reason
        return int(exc.code or 0)
    if a.cmd == "show":
        a.cmd = "status"
    a.cmd = a.cmd.replace("-", "_")  # quota-tree: App.quota_tree
    if a.cmd == "checkpoint":
        return checkpoint_report(a, transport=transport, out=out, err=err)
    try:
        cfg = load_config(url=a.url, token=a.token, profile=a.profile)
        app = App(Client(cfg.url, cfg.token, transport=transport), as_json=a.json, out=out,
                  err=err, sleep=sleep, zone=UTC if a.utc or cfg.utc else None)
        if a.cmd == "session":
            return run_session(app, a)
        if a.cmd in ("reservations", "reservation"):
            return run_reservations(app, a)
        return int(getattr(app, a.cmd)(a))
    except (ConfigError, UsageError, SessionUsage, ReservationUsage) as exc:
        err.write(f"fairq: {exc}\n")
        return EXIT_USAGE
    except Unreachable as exc:
        err.write(f"fairq: {exc}\n")
        return EXIT_UNREACHABLE
    except GaveUp as exc:
        err.write(f"fairq: {exc}\n")
        return EXIT_GAVE_UP
    except WaitTimeout as exc:
        err.write(f"fairq: {exc}\n")
        return EXIT_WAIT_TIMEOUT
    except ApiError as exc:
        err.write(f"fairq: {exc.message}\n")
        return EXIT_UNREACHABLE if exc.code == "unreachable" else EXIT_SERVER_SAID_NO
    except KeyboardInterrupt:
        err.write("fairq: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
