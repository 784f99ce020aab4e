"""Limits on what a job may carry: everything here ends up in a Kubernetes pod spec."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
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
                               "FAIRQ_SIM_FAIL_REPLICA"})
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


def sim_env_problems(env: Mapping[str, Any]) -> list[str]:
    """What is wrong with the simulated cluster's knobs in a job's env (none: [])."""
    problems = []
    for name, parse in (("FAIRQ_SIM_SECONDS", sim_seconds),
                        ("FAIRQ_SIM_EXIT_CODE", sim_exit_code),
                        ("FAIRQ_SIM_FAIL_REPLICA", sim_fail_replica)):
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
