"""platform/Dockerfile copies everything the running app reads: its Python packages,
templates and static files (a missing `static/` once shipped a dashboard without CSS,
htmx or charts, since collectstatic in the image found nothing to collect)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent


def _copied() -> set[str]:
    copied: set[str] = set()
    for line in (ROOT / "platform" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            *sources, _dest = line.split()[1:]
            copied.update(s.rstrip("/") for s in sources)
    return copied


def test_the_image_copies_every_package_and_the_templates_and_static_files() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]
                ["include"]}
    needed = packages | {"manage.py"}
    for directory in [*settings.TEMPLATES[0]["DIRS"], *settings.STATICFILES_DIRS]:
        needed.add(Path(directory).relative_to(ROOT).parts[0])
    assert needed - _copied() == set()


def test_the_web_workers_are_set_by_web_concurrency() -> None:
    """gunicorn takes its worker count from WEB_CONCURRENCY when --workers is absent, so a
    deployment sizes it to its CPU (docs/api.md, "Performance notes")."""
    text = (ROOT / "platform" / "Dockerfile").read_text()
    assert "ENV WEB_CONCURRENCY=" in text
    cmd = next(line for line in text.splitlines() if line.startswith("CMD "))
    assert "gunicorn" in cmd and "--workers" not in cmd
