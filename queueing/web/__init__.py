"""The web dashboard (docs/dashboard.md) and the health check."""

from __future__ import annotations

from .health import healthz, readyz
from .views import healthz_scheduler, home

__all__ = ["healthz", "healthz_scheduler", "home", "readyz"]
