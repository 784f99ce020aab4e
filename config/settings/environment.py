"""What every settings module reads: the repository root and the environment
(django-environ over os.environ and an optional .env file beside manage.py)."""

from __future__ import annotations

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

