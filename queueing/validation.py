"""Limits on what a job may carry: everything here ends up in a Kubernetes pod spec."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from posixpath import normpath
from typing import Any
from urllib.parse import urlsplit

# Every pattern ends with \Z, not $: `$` also matches before a trailing newline, so
# "A\n" passed as an env name. re.ASCII: \w and \d would take any Unicode letter or digit.
# DNS-1123 label: the name becomes part of labels and object names.
JOB_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z", re.ASCII)
# An OCI image reference: [registry[:port]/]path[:tag][@digest], lower-case path, ASCII.
IMAGE_RE = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._/-][a-z0-9]+)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?\Z", re.ASCII
)
# Environment variable names Kubernetes accepts (C_IDENTIFIER-like, as kubectl does).
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*\Z", re.ASCII)

MAX_IMAGE_LEN = 512
MAX_ARGV_ITEMS = 256
MAX_ARG_LEN = 4096
MAX_ENV_ITEMS = 128
MAX_ENV_VALUE_LEN = 32 * 1024
MAX_SPEC_BYTES = 128 * 1024  # command + args + env serialized
MAX_REPLICAS = 1024
# A job accepting several GPU types lists at most this many (each a distinct known type).
MAX_GPU_TYPES = 16
MAX_RUNTIME_SECONDS = 30 * 24 * 3600
# Env names a job may not set (docs/kubernetes.md, "What reaches the pod spec"): the
# NVIDIA container runtime and its hooks read NVIDIA_* (NVIDIA_VISIBLE_DEVICES=all would
# expose every GPU of the node) and CUDA_VISIBLE_DEVICES; the dynamic loader's LD_PRELOAD,
# LD_LIBRARY_PATH and LD_AUDIT reach hooks that run with the container's environment;
# KUBERNETES_* is what the kubelet sets; FAIRQ_* is fairq's. Case-sensitive, as the
# readers are.
RESERVED_ENV_PREFIXES = ("NVIDIA_", "KUBERNETES_", "FAIRQ_")
# The rendezvous of a multi-replica job, set by fairq on every replica (torchrun and
# torch.distributed read them): a job setting its own would point its replicas at each
# other wrongly, so they are fairq's (docs/kubernetes.md, "Replicas that rendezvous").
RENDEZVOUS_ENV = frozenset({"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK",
                            "NPROC_PER_NODE"})
RESERVED_ENV_NAMES = frozenset({"CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "LD_LIBRARY_PATH",
                                "LD_AUDIT"}) | RENDEZVOUS_ENV
# The documented exceptions a job may set: the simulated backend's knobs.
ALLOWED_FAIRQ_ENV = frozenset({"FAIRQ_SIM_SECONDS", "FAIRQ_SIM_EXIT_CODE",
                               "FAIRQ_SIM_FAIL_REPLICA", "FAIRQ_SIM_GPU_UTIL"})
# Set by fairq itself on the members of an array job (never by the user).
ARRAY_JOB_ENV = frozenset({"FAIRQ_ARRAY_INDEX", "FAIRQ_ARRAY_SIZE"})
# Set by fairq itself on every workload (never by the user): which job and which attempt
# of it this is, so a job can resume from its checkpoint after a preemption.
ATTEMPT_ENV = frozenset({"FAIRQ_JOB_ID", "FAIRQ_ATTEMPT"})
# Set by fairq itself for the graceful stop (never by the user): the signal the program
# gets first when it is preempted or cancelled, and where and with what token (a
# credential for this attempt's checkpoints only) it reports its checkpoints.
STOP_ENV = frozenset({"FAIRQ_STOP_SIGNAL", "FAIRQ_CHECKPOINT_URL", "FAIRQ_CHECKPOINT_TOKEN"})
# Every FAIRQ_* name fairq sets on a pod itself.
SET_BY_FAIRQ_ENV = ATTEMPT_ENV | STOP_ENV | ARRAY_JOB_ENV
# What a refusal of a reserved name says (the API's 400 on `env`).
RESERVED_ENV_HELP = (
    "NVIDIA_*, KUBERNETES_*, CUDA_VISIBLE_DEVICES, LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, "
    f"the rendezvous set by fairq ({', '.join(sorted(RENDEZVOUS_ENV))}) and "
    f"FAIRQ_* except {', '.join(sorted(ALLOWED_FAIRQ_ENV))}")


def ascii_int(text: Any) -> int | None:
    """`text` as a whole number when it is one written in ASCII digits (an optional `-`);
    else None. Python's `int()` also reads "１０" (full-width) and "1_000": a query
    parameter or a path id is read as a person typed it, not as Python would."""
    raw = str(text)
    digits = raw[1:] if raw.startswith("-") else raw
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 18:
        return None
    return int(raw)


def env_name_reserved(name: str, *, allowed: frozenset[str] = ALLOWED_FAIRQ_ENV) -> bool:
    """True when a job may not set `name` (the exceptions in `allowed` aside)."""
    if name in allowed:
        return False
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


MAX_SIM_EXIT_CODE = 255


def sim_seconds(value: Any) -> float:
    """`FAIRQ_SIM_SECONDS` as the simulated cluster runs it: a finite number of seconds
    within 0..MAX_RUNTIME_SECONDS. Raises ValueError with a readable message otherwise."""
    try:
        seconds = float(str(value).strip())
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_RUNTIME_SECONDS:
        raise ValueError(f"FAIRQ_SIM_SECONDS must be a number of seconds within "
                         f"0..{MAX_RUNTIME_SECONDS}, not {str(value)[:40]!r}.")
    return seconds


def sim_exit_code(value: Any) -> int:
    """`FAIRQ_SIM_EXIT_CODE` as the simulated cluster uses it: an integer 0..255 (a
    process exit status). Raises ValueError with a readable message otherwise."""
    text = str(value).strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 3 or \
            int(text) > MAX_SIM_EXIT_CODE:
        raise ValueError(f"FAIRQ_SIM_EXIT_CODE must be an integer 0..{MAX_SIM_EXIT_CODE}, "
                         f"not {text[:40]!r}.")
    return int(text)


def sim_fail_replica(value: Any) -> int:
    """`FAIRQ_SIM_FAIL_REPLICA` as the simulated cluster uses it: the index (0-based) of
    the replica that fails, an integer 0..MAX_REPLICAS-1 (an index beyond the job's
    replicas fails none). Raises ValueError with a readable message otherwise."""
    text = str(value).strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 4 or \
            int(text) >= MAX_REPLICAS:
        raise ValueError(f"FAIRQ_SIM_FAIL_REPLICA must be a replica index "
                         f"0..{MAX_REPLICAS - 1}, not {text[:40]!r}.")
    return int(text)


MAX_SIM_GPU_UTIL_STEPS = 60


def sim_gpu_util(value: Any) -> tuple[float, ...]:
    """`FAIRQ_SIM_GPU_UTIL` as the simulated cluster uses it: the SM activity of the job's
    GPUs in percent, one number per minute of its run ('90,90,3': 90% for two minutes,
    then 3% for the rest), 1..MAX_SIM_GPU_UTIL_STEPS numbers each within 0..100. Raises
    ValueError with a readable message otherwise."""
    text = str(value).strip()
    parts = text.split(",")
    try:
        steps = tuple(float(p.strip()) for p in parts)
    except ValueError:
        steps = ()
    if not steps or len(steps) > MAX_SIM_GPU_UTIL_STEPS or \
            not all(math.isfinite(x) and 0 <= x <= 100 for x in steps):
        raise ValueError(f"FAIRQ_SIM_GPU_UTIL must be 1..{MAX_SIM_GPU_UTIL_STEPS} "
                         f"comma-separated percentages 0..100 (one a minute, the last one "
                         f"holds), not {text[:40]!r}.")
    return steps


def sim_env_problems(env: Mapping[str, Any]) -> list[str]:
    """What is wrong with the simulated cluster's knobs in a job's env (none: [])."""
    problems = []
    for name, parse in (("FAIRQ_SIM_SECONDS", sim_seconds),
                        ("FAIRQ_SIM_EXIT_CODE", sim_exit_code),
                        ("FAIRQ_SIM_FAIL_REPLICA", sim_fail_replica),
                        ("FAIRQ_SIM_GPU_UTIL", sim_gpu_util)):
        if name in env:
            try:
                parse(env[name])
            except ValueError as exc:
                problems.append(str(exc))
    return problems


def spec_size(command: list[str], args: list[str], env: dict[str, str]) -> int:
    return len(json.dumps([command, args, env]).encode())


def image_registry_path(image: str) -> str:
    """'ghcr.io/acme/train:1' → 'ghcr.io/acme/train'; 'ubuntu' → 'docker.io/library/ubuntu'
    (Docker's defaults: a first part without '.' or ':' that is not 'localhost' is a path
    on docker.io)."""
    name = image.split("@", 1)[0]
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry, path = first.lower(), rest
    else:
        registry, path = "docker.io", name if sep else f"library/{name}"
    last_slash = path.rfind("/")
    colon = path.rfind(":")
    if colon > last_slash:
        path = path[:colon]  # the tag
    return f"{registry}/{path}"


def registry_problem(image: str, allowlist: list[str] | tuple[str, ...]) -> str | None:
    """None when `image` comes from an allowed registry (or the allow-list is empty), else
    why not. An entry is a registry ('ghcr.io') or a registry/path prefix ('ghcr.io/acme'),
    matched on whole path segments: 'ghcr.io/acme' allows 'ghcr.io/acme/x', not
    'ghcr.io/acme-evil/x'."""
    if not allowlist:
        return None
    full = image_registry_path(image)
    for entry in allowlist:
        prefix = entry.strip().rstrip("/").lower()
        if prefix and (full == prefix or full.startswith(prefix + "/")):
            return None
    return (f"Images must come from an allowed registry ({', '.join(allowlist)}); "
            f"{image!r} resolves to {full!r}.")


# --- resources: Kubernetes quantities (docs/api.md, "Resources") -------------------------
# A pure parser, not kubernetes.utils.parse_quantity: the front ends, which call these
# checks, may not import the Kubernetes client (lint-imports, front-ends-no-cluster), and
# the client's parser takes any length of digits and any exponent (1e999999 builds a
# Decimal of a million digits). This one takes the grammar of the API server's
# resource.Quantity without a sign: digits[.digits][suffix], at most 32 characters.
_QUANTITY_RE = re.compile(
    r"^(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]{1,3})?\Z", re.ASCII)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_EXP = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15,
                "E": 18}
MAX_QUANTITY_LEN = 32
# Far above any node, far below int64 (Kubernetes' and PostgreSQL's bigint): a value
# past these is a typo or an attack, never a job.
MAX_CPU_MILLICORES = 100_000 * 1000  # 100,000 cores
MAX_RESOURCE_BYTES = 2**60  # 1 Ei
# The per-replica resources a job may set, as the API names them (`resources` keys).
RESOURCE_NAMES = ("cpu", "memory", "ephemeral_storage")


def _quantity(text: Any) -> Fraction:
    """The exact value of a Kubernetes quantity without a sign, or ValueError."""
    if not isinstance(text, str):
        raise ValueError("Write a quantity as a string, e.g. \"4\", \"500m\", \"16Gi\".")
    text = text.strip()
    if text.startswith("-"):
        raise ValueError(f"Must be positive, not {text[:MAX_QUANTITY_LEN]!r}.")
    match = _QUANTITY_RE.match(text) if len(text) <= MAX_QUANTITY_LEN else None
    if match is None:
        raise ValueError(f"Not a Kubernetes quantity: {text[:MAX_QUANTITY_LEN]!r} (e.g. "
                         "\"4\", \"500m\", \"16Gi\", \"100G\").")
    value = Fraction(match["number"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    exponent = _DECIMAL_EXP[suffix] if suffix in _DECIMAL_EXP else int(suffix[1:])
    return value * Fraction(10) ** exponent


def parse_cpu(text: Any) -> int:
    """A CPU quantity ("4", "500m", "0.5") in millicores, rounded up as Kubernetes does;
    ValueError with a readable message when it is not a quantity, rounds to zero or is
    above MAX_CPU_MILLICORES."""
    value = _quantity(text)
    if value > MAX_CPU_MILLICORES // 1000:  # before ceil: 1e999 stays cheap
        raise ValueError(f"At most {MAX_CPU_MILLICORES // 1000:,} CPUs.")
    millicores = math.ceil(value * 1000)
    if millicores < 1:
        raise ValueError("Must be at least 1m (a thousandth of a CPU).")
    return millicores


def parse_bytes(text: Any) -> int:
    """A memory or storage quantity ("16Gi", "100G", "1.5Gi") in bytes, rounded up;
    ValueError when it is not a quantity, is zero or is above MAX_RESOURCE_BYTES."""
    value = _quantity(text)
    if value > MAX_RESOURCE_BYTES:
        raise ValueError(f"At most {format_bytes(MAX_RESOURCE_BYTES)}.")
    size = math.ceil(value)
    if size < 1:
        raise ValueError("Must be at least 1 byte.")
    return size


def format_cpu(millicores: int) -> str:
    """Millicores as Kubernetes writes them: 4000 → "4", 500 → "500m"."""
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"


def format_bytes(size: int) -> str:
    """Bytes in the largest binary unit that holds them exactly: 2**30 → "1Gi"."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def parse_resource(name: str, text: Any) -> int:
    """`parse_cpu` for "cpu", `parse_bytes` for memory, ephemeral storage and shm."""
    return parse_cpu(text) if name == "cpu" else parse_bytes(text)


def format_resource(name: str, amount: int) -> str:
    return format_cpu(amount) if name == "cpu" else format_bytes(amount)


# Rule A7 (docs/scheduling.md): a GPU type's topology levels and a job's request.
TOPOLOGY_LEVEL_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,30}[a-z0-9])?\Z", re.ASCII)
# A Kubernetes label key: an optional DNS-subdomain prefix and "/", then a name of at
# most 63 characters of alphanumerics, '-', '_' and '.', starting and ending alphanumeric.
LABEL_KEY_RE = re.compile(
    r"^(?:(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z", re.ASCII)
MAX_TOPOLOGY_LEVELS = 8
TOPOLOGY_MODES = ("required", "preferred")


def topology_levels(value: Any) -> list[dict[str, str]]:
    """A GPU type's `topology_levels`, checked: a list (narrow to wide) of at most
    MAX_TOPOLOGY_LEVELS {"name", "node_label"} objects, names and labels unique;
    ValueError with a readable message otherwise."""
    if not isinstance(value, list):
        raise ValueError('Write a list, e.g. [{"name": "rack", "node_label": '
                         '"topology.kubernetes.io/rack"}].')
    if len(value) > MAX_TOPOLOGY_LEVELS:
        raise ValueError(f"At most {MAX_TOPOLOGY_LEVELS} levels.")
    out: list[dict[str, str]] = []
    for i, level in enumerate(value):
        if not isinstance(level, dict) or set(level) != {"name", "node_label"}:
            raise ValueError(f'Level {i + 1}: want exactly "name" and "node_label".')
        name, label = level["name"], level["node_label"]
        if not isinstance(name, str) or not TOPOLOGY_LEVEL_NAME_RE.match(name):
            raise ValueError(f"Level {i + 1}: the name must be lower-case letters, digits "
                             "and '-' (at most 32), starting with a letter.")
        if not isinstance(label, str) or not LABEL_KEY_RE.match(label):
            raise ValueError(f"Level {i + 1}: {str(label)[:80]!r} is not a Kubernetes "
                             "label key (e.g. topology.kubernetes.io/rack).")
        if any(o["name"] == name for o in out):
            raise ValueError(f"Level {name!r} appears twice.")
        if any(o["node_label"] == label for o in out):
            raise ValueError(f"Node label {label!r} appears twice.")
        out.append({"name": name, "node_label": label})
    return out
# --- storage, secrets and pod metadata (docs/api.md, "Volumes, secrets and metadata") -----
# Pure, like the rest of this module: the front ends check a spec with these (the team's
# allowlists passed in as a `WorkloadPolicy`), and the manifest checks it again with the
# same functions (`policy=None`: no allowlist, every other rule).
# A DNS-1123 label (volume names) and subdomain (PVC, Secret names: always of the job's
# own namespace, so never "ns/name").
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z", re.ASCII)
DNS_SUBDOMAIN_RE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z", re.ASCII)
MAX_DNS_SUBDOMAIN_LEN = 253
# A key of a Secret's data (Kubernetes: [-._a-zA-Z0-9]+, at most 253).
SECRET_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]{1,253}\Z", re.ASCII)
# A path in the container: absolute, of plain characters (no space, no control character,
# no ':' or '\\'), normalised (checked with `normpath`), at most MAX_PATH_LEN.
PATH_RE = re.compile(r"^/[A-Za-z0-9._@+=/-]*\Z", re.ASCII)
MAX_PATH_LEN = 256
# A Kubernetes label name (the part after a prefix) and label value.
LABEL_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z", re.ASCII)
LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?\Z", re.ASCII)
MAX_LABEL_KEY_LEN = 40
MAX_LABEL_VALUE_LEN = 63
MAX_LABELS = 16
MAX_ANNOTATIONS = 16
MAX_ANNOTATION_VALUE_LEN = 1024
MAX_ANNOTATIONS_BYTES = 8 * 1024
# The prefix a job's own labels and annotations get on its Kubernetes Jobs and pods:
# `run: exp-42` becomes `user.fairq.io/run: exp-42`, so a job can never set (or shadow)
# fairq's `fairq.io/*` labels or Kubernetes' `*.kubernetes.io/*`.
USER_LABEL_PREFIX = "user.fairq.io/"
MAX_VOLUMES = 16
MAX_SECRETS = 32
MAX_ALLOWLIST = 200
MAX_WORKING_DIR_LEN = 256
MAX_TERMINATION_GRACE_SECONDS = 24 * 3600

# Graceful stop (docs/api.md, "Checkpoints and graceful stop"): the signals a job may
# ask to get first when stopped, and the shortest checkpoint interval it may declare.
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")
DEFAULT_STOP_SIGNAL = "SIGTERM"
MIN_CHECKPOINT_INTERVAL_SECONDS = 60
MAX_CHECKPOINT_INTERVAL_SECONDS = 30 * 24 * 3600
MAX_CHECKPOINT_PATH_LEN = 1024


def stop_signal_problem(value: Any) -> str | None:
    """Why `value` is not a stop signal a job may ask for (None: it is one)."""
    if value in STOP_SIGNALS:
        return None
    return f"One of {', '.join(STOP_SIGNALS)}."


def checkpoint_interval_problem(value: Any) -> str | None:
    """Why `value` is not a checkpoint interval in seconds (None: it is, or not given)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or \
            not MIN_CHECKPOINT_INTERVAL_SECONDS <= value <= MAX_CHECKPOINT_INTERVAL_SECONDS:
        return (f"Seconds, at least {MIN_CHECKPOINT_INTERVAL_SECONDS} (a checkpoint a minute "
                f"at most) and at most {MAX_CHECKPOINT_INTERVAL_SECONDS}.")
    return None
# Where nothing of a job's may be mounted, over or under (docs/kubernetes.md, "Volumes
# and secrets"): the service-account token's and runtime secrets' directories, devices
# (/dev/shm is `shm_size`'s), the kernel's pseudo file systems, and the files the
# kubelet writes into every container.
FORBIDDEN_MOUNTS = ("/var/run/secrets", "/run/secrets", "/dev", "/proc", "/sys",
                    "/etc/hosts", "/etc/resolv.conf", "/etc/hostname")
# Volume names fairq's own volumes use (the /dev/shm emptyDir; a secret's volume).
RESERVED_VOLUME_NAMES = frozenset({"dshm"})
SECRET_VOLUME_PREFIX = "fq-secret-"
VOLUME_KEYS = frozenset({"name", "pvc", "empty_dir", "mount_path", "read_only"})
EMPTY_DIR_KEYS = frozenset({"size_limit"})
SECRET_ENV_KEYS = frozenset({"secret", "key", "env"})
SECRET_VOLUME_KEYS = frozenset({"secret", "mount_path"})


@dataclass(frozen=True)
class WorkloadPolicy:
    """A team's allowlists (Team.allowed_pvcs, allowed_secrets, allowed_pull_secrets):
    the only PVCs, Secrets and image pull secrets of its namespace its jobs may name."""

    pvcs: frozenset[str] = frozenset()
    secrets: frozenset[str] = frozenset()
    pull_secrets: frozenset[str] = frozenset()


def path_problem(path: Any, *, what: str = "path") -> str | None:
    """Why `path` is not an absolute, normalised container path, or None."""
    if not isinstance(path, str):
        return f"Write the {what} as a string."
    if len(path) > MAX_PATH_LEN:
        return f"At most {MAX_PATH_LEN} characters."
    if not PATH_RE.match(path):
        return (f"The {what} must be absolute, of letters, digits and . _ @ + = - / "
                "(no spaces), e.g. /data.")
    if path.startswith("//") or normpath(path) != path:
        return (f"Write the {what} normalised (no '..', '.', '//' or trailing '/'): "
                f"{normpath('/' + path.lstrip('/'))!r}.")
    return None


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def mount_path_problem(path: Any) -> str | None:
    """Why a volume or a secret may not be mounted at `path`, or None."""
    problem = path_problem(path, what="mount path")
    if problem:
        return problem
    assert isinstance(path, str)
    if path == "/":
        return "Cannot mount over the container's root /."
    for forbidden in FORBIDDEN_MOUNTS:
        if _within(path, forbidden) or _within(forbidden, path):
            return (f"Cannot mount over or under {forbidden} (reserved: "
                    f"{', '.join(FORBIDDEN_MOUNTS)}; /dev/shm is shm_size's).")
    return None


def name_problem(name: Any, *, what: str, allowed: frozenset[str] | None,
                 allowlist: str) -> str | None:
    """Why `name` is not a name of the team's namespace it may use, or None. `allowed`
    None: any valid name (the team is not known, or the manifest re-checks)."""
    if not isinstance(name, str) or not name:
        return f"Name a {what} (a string)."
    if "/" in name:
        return (f"A {what} is always of the team's own namespace: write its name alone, "
                f"not {name[:80]!r}.")
    if len(name) > MAX_DNS_SUBDOMAIN_LEN or not DNS_SUBDOMAIN_RE.match(name):
        return (f"Not a Kubernetes name: {name[:80]!r} (lower-case letters, digits, '-' "
                "and '.').")
    if allowed is not None and name not in allowed:
        shown = ", ".join(sorted(allowed)[:20]) or "none"
        return (f"{what} {name!r} is not in the team's {allowlist} (allowed: {shown}; "
                "team admins set them: /api/v1/teams/{slug}/workload-policy/).")
    return None


def _unknown_keys(item: Mapping[str, Any], known: frozenset[str]) -> list[str]:
    return sorted(str(k) for k in item if k not in known)


def volumes_check(volumes: Any, *, policy: WorkloadPolicy | None, max_scratch_bytes: int
                  ) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """The volumes normalised, and each refusal by its field path (`volumes[1].pvc`).

    A volume is {name, pvc, mount_path, read_only?} (a PersistentVolumeClaim of the
    team's namespace, in its allowlist) or {name, empty_dir: {size_limit}, mount_path}
    (node-local scratch of at most `max_scratch_bytes`); any other key, at any depth, is
    refused (no hostPath, nfs, namespace, ... in any spelling)."""
    problems: dict[str, list[str]] = {}
    out: list[dict[str, Any]] = []
    if volumes is None:
        return out, problems
    if not isinstance(volumes, list):
        return out, {"volumes": ["Write the volumes as a list."]}
    if len(volumes) > MAX_VOLUMES:
        return out, {"volumes": [f"At most {MAX_VOLUMES} volumes."]}
    names: set[str] = set()
    for i, item in enumerate(volumes):
        at = f"volumes[{i}]"
        if not isinstance(item, Mapping):
            problems[at] = ["Write each volume as an object."]
            continue
        for key in _unknown_keys(item, VOLUME_KEYS):
            problems[f"{at}.{key}"] = [
                "Unknown field (a volume has name, pvc or empty_dir, mount_path, read_only)."]
        name = item.get("name")
        if not isinstance(name, str) or not DNS_LABEL_RE.match(name):
            problems[f"{at}.name"] = ["Use at most 63 lower-case letters, digits and '-' "
                                      "(a Kubernetes volume name)."]
        elif name in RESERVED_VOLUME_NAMES or name.startswith(SECRET_VOLUME_PREFIX):
            problems[f"{at}.name"] = [f"{name!r} is fairq's own (dshm, fq-secret-*)."]
        elif name in names:
            problems[f"{at}.name"] = [f"Another volume is named {name!r}."]
        else:
            names.add(name)
        has_pvc, has_dir = "pvc" in item, "empty_dir" in item
        volume: dict[str, Any] = {"name": name}
        if has_pvc == has_dir:
            problems.setdefault(at, []).append("Give exactly one of pvc and empty_dir.")
        elif has_pvc:
            problem = name_problem(item["pvc"], what="PVC", allowlist="allowed PVCs",
                                   allowed=None if policy is None else policy.pvcs)
            if problem:
                problems[f"{at}.pvc"] = [problem]
            volume["pvc"] = item["pvc"]
        else:
            empty_dir = item["empty_dir"]
            if not isinstance(empty_dir, Mapping):
                problems[f"{at}.empty_dir"] = ['Write it as {"size_limit": "100Gi"}.']
            else:
                for key in _unknown_keys(empty_dir, EMPTY_DIR_KEYS):
                    problems[f"{at}.empty_dir.{key}"] = [
                        "Unknown field (an empty_dir has size_limit only)."]
                size = empty_dir.get("size_limit")
                try:
                    if size is None:
                        raise ValueError("Required: the most this scratch may hold, e.g. "
                                         "\"100Gi\".")
                    size_bytes = parse_bytes(size)
                    if size_bytes > max_scratch_bytes:
                        raise ValueError(f"At most {format_bytes(max_scratch_bytes)} of "
                                         "scratch per volume.")
                except ValueError as exc:
                    problems[f"{at}.empty_dir.size_limit"] = [str(exc)]
                else:
                    volume["empty_dir"] = {"size_limit": size.strip()}
        volume["mount_path"] = item.get("mount_path")
        read_only = item.get("read_only", False)
        if not isinstance(read_only, bool):
            problems[f"{at}.read_only"] = ["Must be true or false."]
        if has_pvc and not has_dir:
            volume["read_only"] = read_only
        elif read_only:
            problems[f"{at}.read_only"] = ["Only a pvc volume can be read-only."]
        out.append(volume)
    return out, problems


def secrets_check(secrets: Any, *, policy: WorkloadPolicy | None, env: Mapping[str, Any]
                  ) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """The secret references normalised, and each refusal by its field path.

    {secret, key, env}: one key of a Secret as an environment variable (a valid name, not
    reserved, not one of the job's literal `env`); {secret, mount_path}: the whole Secret
    as read-only files (one per key) under mount_path. Only references: the values never
    pass through fairq."""
    problems: dict[str, list[str]] = {}
    out: list[dict[str, Any]] = []
    if secrets is None:
        return out, problems
    if not isinstance(secrets, list):
        return out, {"secrets": ["Write the secrets as a list."]}
    if len(secrets) > MAX_SECRETS:
        return out, {"secrets": [f"At most {MAX_SECRETS} secret references."]}
    env_names: set[str] = set()
    for i, item in enumerate(secrets):
        at = f"secrets[{i}]"
        if not isinstance(item, Mapping):
            problems[at] = ["Write each secret as an object."]
            continue
        as_env = "env" in item or "key" in item
        known = SECRET_ENV_KEYS if as_env else SECRET_VOLUME_KEYS
        for key in _unknown_keys(item, known):
            problems[f"{at}.{key}"] = [
                "Unknown field: a secret is {secret, key, env} (an environment variable) "
                "or {secret, mount_path} (files)."]
        problem = name_problem(item.get("secret"), what="Secret", allowlist="allowed secrets",
                               allowed=None if policy is None else policy.secrets)
        if problem:
            problems[f"{at}.secret"] = [problem]
        if as_env:
            data_key, env_name = item.get("key"), item.get("env")
            if not isinstance(data_key, str) or not SECRET_KEY_RE.match(data_key):
                problems[f"{at}.key"] = ["The key of the Secret's data to read (letters, "
                                         "digits, '-', '_', '.')."]
            if not isinstance(env_name, str) or not ENV_NAME_RE.match(env_name) or \
                    len(env_name) > 253:
                problems[f"{at}.env"] = ["A valid environment variable name, e.g. HF_TOKEN."]
            elif env_name_reserved(env_name, allowed=frozenset()):
                problems[f"{at}.env"] = [f"{env_name} is reserved ({RESERVED_ENV_HELP})."]
            elif env_name in env:
                problems[f"{at}.env"] = [f"The job's env sets {env_name} already."]
            elif env_name in env_names:
                problems[f"{at}.env"] = [f"Another secret sets {env_name} already."]
            else:
                env_names.add(env_name)
            out.append({"secret": item.get("secret"), "key": data_key, "env": env_name})
        else:
            if "mount_path" not in item:
                problems[f"{at}.mount_path"] = [
                    "Give env and key (an environment variable) or mount_path (files)."]
            out.append({"secret": item.get("secret"), "mount_path": item.get("mount_path")})
    return out, problems


def mounts_check(volumes: list[dict[str, Any]], secrets: list[dict[str, Any]]
                 ) -> dict[str, list[str]]:
    """Each mount path's refusal: not a path, a forbidden place, or over, under or at
    another mount of the job."""
    problems: dict[str, list[str]] = {}
    mounts = [(f"volumes[{i}].mount_path", v.get("mount_path")) for i, v in enumerate(volumes)]
    mounts += [(f"secrets[{i}].mount_path", s.get("mount_path")) for i, s in enumerate(secrets)
               if "env" not in s]
    seen: list[tuple[str, str]] = []
    for at, path in mounts:
        problem = mount_path_problem(path)
        if problem is None:
            assert isinstance(path, str)
            clash = [other for other, p in seen if _within(path, p) or _within(p, path)]
            if clash:
                problem = f"Overlaps {clash[0]} (mounts may not be at, over or under another)."
            else:
                seen.append((at, path))
        if problem:
            problems[at] = [problem]
    return problems


def metadata_check(items: Any, *, field: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """A job's `labels` or `annotations` (`field`): at most 16 plain keys (no prefix:
    fairq adds USER_LABEL_PREFIX), label values valid Kubernetes label values,
    annotation values at most 1024 characters and 8 KiB together."""
    if items is None:
        return {}, {}
    if not isinstance(items, Mapping):
        return {}, {field: ["Write them as an object of names to strings."]}
    most = MAX_LABELS if field == "labels" else MAX_ANNOTATIONS
    if len(items) > most:
        return {}, {field: [f"At most {most}."]}
    problems: dict[str, list[str]] = {}
    for key, value in items.items():
        at = f"{field}.{key}"
        if not isinstance(key, str) or len(key) > MAX_LABEL_KEY_LEN or \
                not LABEL_NAME_RE.match(key):
            problems[at] = [
                f"Keys are plain names of at most {MAX_LABEL_KEY_LEN} letters, digits, '-', "
                f"'_' and '.' (no prefix such as kubernetes.io/ or fairq.io/: fairq puts them "
                f"under {USER_LABEL_PREFIX})."]
            continue
        if not isinstance(value, str):
            problems[at] = ["Values are strings."]
        elif field == "labels" and (len(value) > MAX_LABEL_VALUE_LEN
                                    or not LABEL_VALUE_RE.match(value)):
            problems[at] = [f"A label value is at most {MAX_LABEL_VALUE_LEN} letters, digits, "
                            "'-', '_' and '.', starting and ending with a letter or digit."]
        elif field == "annotations" and len(value) > MAX_ANNOTATION_VALUE_LEN:
            problems[at] = [f"At most {MAX_ANNOTATION_VALUE_LEN} characters."]
    if not problems and field == "annotations":
        size = sum(len(k.encode()) + len(str(v).encode()) for k, v in items.items())
        if size > MAX_ANNOTATIONS_BYTES:
            problems[field] = [f"At most {MAX_ANNOTATIONS_BYTES // 1024} KiB together, not "
                               f"{size:,} bytes."]
    return ({str(k): str(v) for k, v in items.items()} if not problems else {}), problems


def workload_check(
    *, volumes: Any = None, secrets: Any = None, image_pull_secret: Any = "",
    working_dir: Any = "", labels: Any = None, annotations: Any = None,
    env: Mapping[str, Any] | None = None, policy: WorkloadPolicy | None,
    max_scratch_bytes: int,
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Every storage, secret and metadata field of a job: their normalised values (the
    Job's fields of those names) and each refusal by field path. `policy` None checks
    everything but the team's allowlists."""
    problems: dict[str, list[str]] = {}
    vols, found = volumes_check(volumes, policy=policy, max_scratch_bytes=max_scratch_bytes)
    problems.update(found)
    secs, found = secrets_check(secrets, policy=policy, env=env or {})
    problems.update(found)
    for at, refusal in mounts_check(vols, secs).items():
        problems.setdefault(at, refusal)
    pull = image_pull_secret or ""
    if pull:
        problem = name_problem(pull, what="image pull secret",
                               allowlist="allowed pull secrets",
                               allowed=None if policy is None else policy.pull_secrets)
        if problem:
            problems["image_pull_secret"] = [problem]
    workdir = working_dir or ""
    if workdir:
        problem = path_problem(workdir, what="working directory")
        if problem:
            problems["working_dir"] = [problem]
    lab, found = metadata_check(labels, field="labels")
    problems.update(found)
    ann, found = metadata_check(annotations, field="annotations")
    problems.update(found)
    return ({"volumes": vols, "secrets": secs, "image_pull_secret": pull,
             "working_dir": workdir, "labels": lab, "annotations": ann}, problems)


def allowlist_problem(names: Any) -> str | None:
    """Why `names` is not a team allowlist (a list of at most MAX_ALLOWLIST distinct
    Kubernetes names of the team's namespace), or None."""
    if not isinstance(names, list):
        return "Write a list of names."
    if len(names) > MAX_ALLOWLIST:
        return f"At most {MAX_ALLOWLIST} names."
    for name in names:
        problem = name_problem(name, what="name", allowed=None, allowlist="")
        if problem:
            return problem
    if len(set(names)) != len(names):
        return "Each name once."
    return None


# --- webhook URLs (docs/webhooks.md) ----------------------------------------------------

MAX_WEBHOOK_URL_LEN = 2000
MAX_NOTIFY_PREFIXES = 50


def webhook_url_problem(url: Any) -> str | None:
    """Why `url` cannot receive webhooks (an absolute http or https URL with a host, no
    user:password, no fragment, at most MAX_WEBHOOK_URL_LEN characters), or None. Where
    it points (private or link-local addresses) is checked when it is sent to."""
    if not isinstance(url, str) or not url:
        return "Write an http:// or https:// URL."
    if len(url) > MAX_WEBHOOK_URL_LEN:
        return f"At most {MAX_WEBHOOK_URL_LEN} characters."
    if any(c.isspace() or ord(c) < 32 for c in url):
        return "No spaces or control characters."
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return "Not a valid URL."
    if parts.scheme not in ("http", "https"):
        return "Use an http:// or https:// URL."
    if not parts.hostname:
        return "The URL has no host."
    if "@" in parts.netloc:
        return "No user name or password in the URL (the signature proves the sender)."
    if parts.fragment:
        return "No #fragment."
    return None


def notify_prefixes_problem(prefixes: Any) -> str | None:
    """Why `prefixes` is not a team's notify URL allowlist (a list of at most
    MAX_NOTIFY_PREFIXES distinct webhook URLs whose path ends with "/", so that
    "https://ci.example.com/" does not allow "https://ci.example.com.evil.net/"), or
    None."""
    if not isinstance(prefixes, list):
        return "Write a list of URL prefixes."
    if len(prefixes) > MAX_NOTIFY_PREFIXES:
        return f"At most {MAX_NOTIFY_PREFIXES} prefixes."
    for prefix in prefixes:
        problem = webhook_url_problem(prefix)
        if problem:
            return f"{str(prefix)[:100]!r}: {problem}"
        if "?" in prefix or not prefix.endswith("/") or prefix.count("/") < 3:
            return (f"{prefix[:100]!r}: a prefix ends with '/' after the host, e.g. "
                    "'https://ci.example.com/hooks/', and has no '?'.")
    if len(set(prefixes)) != len(prefixes):
        return "Each prefix once."
    return None


def notify_url_allowed(url: str, prefixes: Any) -> bool:
    """`url` starts with one of `prefixes` (a checked allowlist)."""
    return any(isinstance(p, str) and url.startswith(p) for p in prefixes or ())


# --- Shared GPUs: a job's `gpus` (docs/api.md, "Fractions of a GPU") ---------------------

MAX_GPUS_TEXT_LEN = 16
_GPUS_RE = re.compile(r"^\s*\+?(?:(?P<num>[0-9]{1,6})\s*/\s*(?P<den>[0-9]{1,3})|"
                      r"(?P<dec>[0-9]{0,6}(?:\.[0-9]{1,9})?))\s*\Z", re.ASCII)
GPUS_SHAPE = ("A number of GPUs (2) or a fraction of one (0.5 or 1/4), written with the "
              "digits 0-9 only.")


def parse_gpus(value: Any) -> int | Fraction:
    """A job's `gpus` per replica as given: a whole number of GPUs (1, 2, "4"), or a
    fraction of one GPU (0.25, "0.5", "1/4"): an int for a whole number, else a Fraction
    in (0, 1) or above 1 (the GPU type decides whether it is allowed: `gpus_on_type`).
    A float that is k/n for a small n up to float rounding (1/3 as 0.3333333333333333)
    is that fraction. ValueError with the refusal otherwise."""
    if isinstance(value, bool):
        raise ValueError(GPUS_SHAPE)
    if isinstance(value, int):
        amount: Fraction = Fraction(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("A finite number of GPUs.")
        exact = Fraction(repr(value))
        near = exact.limit_denominator(64)
        amount = near if abs(near - exact) < Fraction(1, 10**9) else exact
    elif isinstance(value, str) and len(value) <= MAX_GPUS_TEXT_LEN and (
            match := _GPUS_RE.match(value)) and (match["num"] or match["dec"]):
        if match["num"] is not None:
            if int(match["den"]) == 0:
                raise ValueError("A fraction's denominator is at least 1 (1/4).")
            amount = Fraction(int(match["num"]), int(match["den"]))
        else:
            amount = Fraction(match["dec"])
    else:
        raise ValueError(GPUS_SHAPE)
    if amount <= 0:
        raise ValueError("Ask at least one GPU, or a fraction of one above 0 (0.25, 1/4).")
    if amount > 10**6:
        raise ValueError("At most 1000000 GPUs per replica.")
    return int(amount) if amount.denominator == 1 else amount


def gpus_text(amount: int | Fraction | float) -> str:
    """`amount` GPUs as written back: 2, 0.25, 0.5; a fraction without a short decimal
    as k/n (1/3)."""
    value = Fraction(amount).limit_denominator(10**6) if isinstance(amount, float) \
        else Fraction(amount)
    if value.denominator == 1:
        return str(value.numerator)
    for digits in range(1, 7):
        scaled = value * 10**digits
        if scaled.denominator == 1:
            return f"{float(value):.{digits}f}"
    return f"{value.numerator}/{value.denominator}"


def gpus_on_type(amount: int | Fraction, *, slug: str, sharing: str, slices_per_gpu: int,
                 several_types: bool = False) -> tuple[int, int] | str:
    """Shared GPUs: a job's `gpus` per replica on its GPU type as (gpus_per_replica,
    gpu_slices), or the refusal. A whole number: whole devices, slices 0. A fraction: k
    slices of one GPU of a time-sliced or MPS type (k = amount x slices_per_gpu, a whole
    number below slices_per_gpu), gpus_per_replica 1; refused on any other type, above
    one GPU, off the type's 1/S steps, or with several GPU types accepted."""
    if isinstance(amount, int):
        return amount, 0
    shown = gpus_text(amount)
    if sharing not in ("time-sliced", "mps"):
        return (f"{shown} GPU is a fraction: fractions need a time-sliced or MPS GPU type "
                f"({slug} is {sharing}); ask whole GPUs on {slug}.")
    if several_types:
        return (f"{shown} GPU is a fraction: a fraction accepts one GPU type (the "
                "type's slices are packed per GPU); give only gpu_type.")
    if amount > 1:
        return (f"{shown} GPU: a fraction is less than one GPU; ask whole GPUs (1, 2, ...) "
                "or a fraction below 1.")
    slices = amount * slices_per_gpu
    if slices.denominator != 1:
        steps = ", ".join(gpus_text(Fraction(k, slices_per_gpu))
                          for k in range(1, slices_per_gpu))
        return (f"{shown} is not a multiple of 1/{slices_per_gpu} GPU of {slug} "
                f"({slices_per_gpu} slices per GPU): use {steps}.")
    return 1, int(slices)


SHARING_MODES = ("exclusive", "mig", "time-sliced", "mps")
MAX_SLICES_PER_GPU = 64


def gpu_sharing_problems(sharing: Any, slices_per_gpu: Any) -> dict[str, str]:
    """A GPU type's sharing and slices per GPU on their own (docs/api.md, "Fractions of a
    GPU"): exclusive has 1 slice (a whole GPU); mig (the profile's instances per GPU),
    time-sliced and mps (the device plugin's replicas per GPU) at least 2 and at most
    64. {} when fine; else the refusal per field."""
    if sharing not in SHARING_MODES:
        return {"sharing": f"One of: {', '.join(SHARING_MODES)}."}
    if isinstance(slices_per_gpu, bool) or not isinstance(slices_per_gpu, int):
        return {"slices_per_gpu": "A whole number."}
    if sharing == "exclusive" and slices_per_gpu != 1:
        return {"slices_per_gpu": "An exclusive type has 1 slice per GPU (whole GPUs); "
                                  "choose time-sliced, mps or mig to share a GPU."}
    if sharing != "exclusive" and not 2 <= slices_per_gpu <= MAX_SLICES_PER_GPU:
        what = ("instances of this MIG profile per GPU (7 for 1g.10gb on an A100 80GB)"
                if sharing == "mig" else "the device plugin's replicas per GPU (e.g. 4)")
        return {"slices_per_gpu": f"A {sharing} type has 2 to {MAX_SLICES_PER_GPU} "
                                  f"slices per GPU: {what}."}
    return {}
