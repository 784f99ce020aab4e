"""The web dashboard (docs/dashboard.md) and the health check."""

from __future__ import annotations

from .views import healthz, healthz_scheduler, home

__all__ = ["healthz", "healthz_scheduler", "home"]
