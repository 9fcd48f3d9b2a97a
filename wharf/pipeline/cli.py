"""`wharf <command> [args]`: the one command line of the project (the `wharf` console script;
the Makefile's targets call it).

Each command is a module with `main(argv, prog) -> int`, imported only when it runs (wharf.entry
.launch applies the env defaults first), so `wharf replay` never loads collect's agents or harbor.
"""
from __future__ import annotations

import sys

from wharf.core.entry import launch, quiet_broken_pipe

# command -> (module, what it does)
COMMANDS = {
    "demo": ("wharf.pipeline.demo", "the embedded default: one collect round on the bundled toy tasks, then its audit"),
    "collect": ("wharf.collect.cli", "one collect round: the agents' trials through the recording proxy"),
    "convert": ("wharf.convert.cli", "stored collect dirs -> training rows, GRPO advantages, micro-batches"),
    "train": ("wharf.pipeline.train", "LoRA GRPO on a round's micro-batches; publishes policy-v<round+1>"),
    "publish": ("wharf.train.publish", "publish (again) the adapter `wharf train` wrote"),
    "loop": ("wharf.pipeline.loop", "collect -> convert -> train -> publish, `rounds` times; resumable"),
    "eval": ("wharf.pipeline.eval", "policies side by side on a task set (base, <run>:<k>, adapter dirs); no training"),
    "replay": ("wharf.pipeline.replay", "convert + train from stored collect dirs; no agent, no endpoint"),
    "report": ("wharf.pipeline.report.cli", "write a run's report.html, or draw runs' rewards side by side"),
    "serve": ("wharf.engine.cli", "serve the local engine (vLLM's HTTP API)"),
    "proxy": ("wharf.collect.proxy.cli", "serve the recording proxy"),
    "chat": ("wharf.collect.demo", "one chat completion, shown with its token ids and log-probs"),
    "import": ("wharf.collect.importers.cli", "trajectory files (ATIF, mini-swe-agent) -> a collect dir of text-only rows"),
    "audit": ("wharf.collect.audit", "check a collect dir's rows against the agents' own logs"),
    "tasks": ("wharf.pipeline.tasks", "task dirs: `tasks check` validates and audits them, `tasks make` makes them"),
    "agents-check": ("wharf.pipeline.agents_check", "one real trial per agent through the proxy (a repo tool)"),
}


def version() -> str:
    """The installed distribution's version (a checkout never installed has none)."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version("wharf")
    except PackageNotFoundError:
        return "0+unknown"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return ("usage: wharf <command> [--config FILE] [key=value ...]   (wharf <command> --help: its keys)\n"
            "       wharf --version\n\n"
            "commands:\n" + "\n".join(lines))


@quiet_broken_pipe
def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] in ("-V", "--version"):
        print(f"wharf {version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"wharf: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return launch(COMMANDS[name][0], f"wharf {name}", rest)


if __name__ == "__main__":
    sys.exit(main())
