"""Render platform/k8s's overlays with `kubectl kustomize` (Kustomize >= v5), for the
tests of the packaged install. Without such a kubectl the caller skips, unless
FAIRQ_REQUIRE_KUSTOMIZE=1 (CI), when it fails (`make kustomize` says what is there)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

PLATFORM = Path(__file__).resolve().parents[1] / "platform" / "k8s"
OVERLAYS = ("dev", "prod")


def kubectl() -> str:
    path = shutil.which("kubectl")
    reason = ""
    if path is None:
        reason = "no kubectl on PATH"
    else:
        out = subprocess.run([path, "version", "--client"], capture_output=True, text=True,
                             timeout=60).stdout
        line = next((x for x in out.splitlines() if x.startswith("Kustomize Version")), "")
        major = line.split(":")[-1].strip().lstrip("v").split(".")[0]
        if not major.isdigit() or int(major) < 5:
            reason = f"kubectl's Kustomize is not >= v5 ({line or 'none'})"
    if reason:
        if os.environ.get("FAIRQ_REQUIRE_KUSTOMIZE") == "1":
            pytest.fail(f"{reason} (FAIRQ_REQUIRE_KUSTOMIZE=1: a failure, not a skip)")
        pytest.skip(f"{reason}; run `make kustomize`; FAIRQ_REQUIRE_KUSTOMIZE=1 makes this fail")
    assert path is not None
    return path


def render_text(directory: Path) -> str:
    out = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def render(directory: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(render_text(directory)) if d]
