"""The CLI fixtures for the array and dependency commands (tests/cli/conftest.py, tests/cli/live.py)."""

from tests.cli.conftest import cli  # noqa: F401 - a fixture, re-exported
from tests.cli.live import live  # noqa: F401 - the live server, for test_cli_array_wait.py
