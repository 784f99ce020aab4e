"""`manage.py simulate [fairq-sim options]`: the trace simulator (docs/simulator.md), the
same `main` as the `fairq-sim` console script. It reads no database and no settings."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from queueing.simulator.cli import main


class Command(BaseCommand):
    help = "Replay a trace or scenario through fairq's policy and the baselines (fairq-sim)."

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # fairq-sim's options are not this parser's: pass whatever it does not know on
        # (call_command parses its arguments here; run_from_argv does not).
        parser = super().create_parser(prog_name, subcommand, **kwargs)

        def parse_args(args: Any = None, namespace: Any = None) -> argparse.Namespace:
            ns, extra = parser.parse_known_args(args, namespace)
            ns.args = extra  # in their order, options and values alike
            return ns  # type: ignore[no-any-return]

        parser.parse_args = parse_args  # type: ignore[method-assign,assignment]
        return parser

    def run_from_argv(self, argv: list[str]) -> None:
        # Every option after the command name is fairq-sim's, --help included.
        code = main(argv[2:])
        if code:
            raise SystemExit(code)

    def handle(self, *args: Any, **options: Any) -> None:
        code = main(list(args))
        if code:
            raise CommandError(f"fairq-sim exited with {code}")
