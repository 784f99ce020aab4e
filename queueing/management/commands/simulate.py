"""`manage.py simulate [fairq-sim options]`: the trace simulator (docs/simulator.md), the
same `main` as the `fairq-sim` console script. It reads no database and no settings."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from queueing.simulator.cli import main


class Command(BaseCommand):
    help = "Replay a trace or scenario through fairq's policy and the baselines (fairq-sim)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs="*", help="fairq-sim's options (see --help after --)")

    def run_from_argv(self, argv: list[str]) -> None:
        # Every option after the command name is fairq-sim's, --help included.
        code = main(argv[2:])
        if code:
            raise SystemExit(code)

    def handle(self, *args: Any, **options: Any) -> None:
        code = main(list(args))
        if code:
            raise CommandError(f"fairq-sim exited with {code}")
