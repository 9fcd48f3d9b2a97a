"""`wharf tasks <subcommand>`: what a task is and whether it holds.

    check  wharf tasks check DIR...   validate task dirs: oracle, untouched, the hackability audit
    make   wharf tasks make PACKAGE   real-repository tasks from a package (wharf/tasks/factory)
    stats  wharf tasks stats DIR      a manifest dir's figures: yield, hunt time, checks under today's judge

`make` runs wharf.tasks.factory.cli's `main(argv, prog, check)`, `check` being
wharf.pipeline.taskcheck.check_task (the factory checks every task it makes with it and cannot
import it itself: the tasks room stands below the pipeline)."""
from __future__ import annotations

import sys

SUBCOMMANDS = {
    "check": "validate task dirs: the oracle 1.0, the untouched workspace 0, the hackability audit",
    "make": "make checked real-repository tasks from a package's source and its test suite",
    "stats": "a dir of task manifests in figures: tests, yield, hunt time, checks under today's judge",
}


def usage() -> str:
    lines = [f"  {name:<6} {what}" for name, what in SUBCOMMANDS.items()]
    return "usage: wharf tasks <subcommand> [args]   (wharf tasks <subcommand> --help)\n\nsubcommands:\n" + "\n".join(lines)


def make(argv: list[str], prog: str) -> int:
    from wharf.pipeline.taskcheck import check_task
    from wharf.tasks.factory import cli as factory

    return factory.main(argv, prog, check=check_task)


def main(argv: list[str] | None = None, prog: str = "wharf tasks") -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name == "check":
        from wharf.pipeline.taskcheck.cli import main as check_main

        return check_main(rest, f"{prog} check")
    if name == "make":
        return make(rest, f"{prog} make")
    if name == "stats":
        from wharf.tasks.factory.stats import main as stats_main

        return stats_main(rest, f"{prog} stats")
    print(f"{prog}: unknown subcommand {name!r}: use one of {', '.join(SUBCOMMANDS)} (see {prog} --help)",
          file=sys.stderr)
    return 2
