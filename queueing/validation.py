"""Limits on what a job may carry: everything here ends up in a Kubernetes pod spec."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

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
# What a refusal of a reserved name says (the API's 400 on `env`).
RESERVED_ENV_HELP = (
    "NVIDIA_*, KUBERNETES_*, CUDA_VISIBLE_DEVICES, LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, "
    f"the rendezvous set by fairq ({', '.join(sorted(RENDEZVOUS_ENV))}) and "
    f"FAIRQ_* except {', '.join(sorted(ALLOWED_FAIRQ_ENV))}")


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
