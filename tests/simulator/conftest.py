from __future__ import annotations

import os
from pathlib import Path

import pytest

TRACE = Path(os.environ.get("FAIRQ_SIM_TRACE", "/work/shared/traces/alibaba-openb-2023"))


@pytest.fixture
def trace_dir() -> Path:
    if not (TRACE / "pods.csv").is_file() or not (TRACE / "nodes.csv").is_file():
        pytest.skip(f"the openb trace is not at {TRACE} (set FAIRQ_SIM_TRACE to its directory)")
    return TRACE
