"""The CLI fixture for the array and dependency commands (tests/cli/conftest.py)."""

from tests.cli.conftest import cli  # noqa: F401 - a fixture, re-exported
