"""The web dashboard (docs/dashboard.md) and the health check."""

from __future__ import annotations

from .views import healthz, home

__all__ = ["healthz", "home"]
