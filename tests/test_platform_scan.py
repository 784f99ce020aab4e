"""The manifest security scan: checkov on what each overlay renders finds nothing but the
findings accepted in platform/k8s (checkov.yaml for every object, `checkov.io/skip<N>`
annotations for one object, each with its reason). A new finding fails; so does a new
accepted one until it is listed here.

checkov lives in its own venv (`make checkov`: ~/.cache/fairq-checkov, or
FAIRQ_CHECKOV=<path to checkov>); without it this skips, unless FAIRQ_REQUIRE_CHECKOV=1
(CI), when it fails. Rendering needs kubectl with Kustomize >= v5 (tests/platform_render.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.platform_render import OVERLAYS, PLATFORM, render_text

# (overlay, check, resource) accepted on one object, for the reason in its annotation.
ACCEPTED = {
    (overlay, check, resource)
    for overlay in OVERLAYS
    for check, resource in (
        ("CKV_K8S_38", "Deployment.fairq-system.fairq-worker"),
        ("CKV_K8S_9", "Deployment.fairq-system.fairq-worker"),
        ("CKV_K8S_9", "Deployment.fairq-system.fairq-beat"),
        ("CKV_K8S_9", "Deployment.fairq-system.fairq-webhooks"),
        ("CKV_K8S_38", f"Job.fairq-system.fairq-sync-cluster-{'dev' if overlay == 'dev' else '1.0.0'}"),
    )
} | {
    ("dev", "CKV_K8S_40", "Deployment.fairq-system.fairq-postgres"),
    ("dev", "CKV_K8S_40", "Deployment.fairq-system.fairq-redis"),
}


def checkov() -> str:
    path = os.environ.get("FAIRQ_CHECKOV") or str(
        Path.home() / ".cache" / "fairq-checkov" / "bin" / "checkov")
    if not os.access(path, os.X_OK):
        if os.environ.get("FAIRQ_REQUIRE_CHECKOV") == "1":
            pytest.fail(f"no checkov at {path} (FAIRQ_REQUIRE_CHECKOV=1: a failure, not a skip)")
        pytest.skip(f"no checkov at {path}: run `make checkov`")
    return path


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_checkov_finds_nothing_but_the_accepted_findings(overlay: str, tmp_path: Path) -> None:
    rendered = tmp_path / f"{overlay}.yaml"
    rendered.write_text(render_text(PLATFORM / "overlays" / overlay))
    out = subprocess.run(
        [checkov(), "--config-file", str(PLATFORM / "checkov.yaml"), "-f", str(rendered),
         "-o", "json"], capture_output=True, text=True, timeout=300)
    report = json.loads(out.stdout)
    assert report["check_type"] == "kubernetes"
    results = report["results"]
    failed = [(c["check_id"], c["resource"], c["check_name"]) for c in results["failed_checks"]]
    assert failed == [], failed
    assert out.returncode == 0, out.stderr
    skipped = {(overlay, c["check_id"], c["resource"]) for c in results["skipped_checks"]
               if c["check_id"] not in ("CKV_K8S_43", "CKV_K8S_15", "CKV_K8S_35")}
    assert skipped == {a for a in ACCEPTED if a[0] == overlay}
    for c in results["skipped_checks"]:
        assert c["check_result"].get("suppress_comment"), c["check_id"]
    assert report["summary"]["passed"] > 400  # it really scanned the objects
    assert report["summary"]["parsing_errors"] == 0
