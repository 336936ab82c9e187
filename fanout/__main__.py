"""The ``fanout`` command: ``python -m fanout demo`` (or ``fanout demo`` once installed)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fanout", description="Run an AI agent's parallel tool calls under trio."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="watch a throttled agent turn against a local API (no network, no setup)",
        description="Play an agent turn against a rate-limited server on 127.0.0.1 and show "
        "each call's life, the message sent back to the model, and what was waited for.",
    )
    demo.add_argument("--json", action="store_true", help="print machine-readable output only")
    demo.add_argument("--calls", type=int, default=12, help="calls in the turn (default 12)")
    demo.add_argument(
        "--rate", type=float, default=3.0, help="the ticket API's requests a second (default 3)"
    )
    demo.add_argument("--burst", type=int, default=2, help="the ticket API's burst (default 2)")
    demo.add_argument(
        "--latency", type=float, default=0.15, help="server latency in seconds (default 0.15)"
    )
    demo.add_argument(
        "--policy",
        choices=("one", "serial", "parallel"),
        default="one",
        help="how the turn's writes run (default: one, fanout's default)",
    )
    demo.add_argument(
        "--faults", type=int, default=1, help="the server's first N requests answer 500 (default 1)"
    )
    demo.add_argument(
        "--stream",
        type=float,
        nargs="?",
        const=3.0,
        default=None,
        metavar="SECONDS",
        help="the model's message arrives as a stream over SECONDS (default 3): calls start "
        "while it is still arriving",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the command; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command != "demo":
        parser.print_help()
        return 0 if args.command is None else 2
    from ._demo import DemoOptions, run_demo

    try:
        options = DemoOptions(
            calls=args.calls,
            rate=args.rate,
            burst=args.burst,
            latency=args.latency,
            policy=args.policy,
            faults=args.faults,
            stream=args.stream,
        )
    except ValueError as exc:
        parser.error(str(exc))
    return run_demo(options, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
