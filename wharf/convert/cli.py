"""`wharf convert --config FILE [key=value ...]`: one round's (or convert.jobs') stored collect
dirs -> micro-batches, index.json and stats.json (make convert)."""
from __future__ import annotations

from wharf.convert.reader import ConvertInputError
from wharf.convert.stage import convert_round
from wharf.core.config import cli_config
from wharf.core.entry import guarded


def main(argv: list[str] | None = None, prog: str = "wharf convert") -> int:
    cfg = cli_config(argv, prog, "Stored collect dirs -> training rows, advantages, micro-batches.")
    return guarded(prog, lambda: _convert(cfg))


def _convert(cfg) -> int:
    try:
        convert_round(cfg, progress=True)
    except ConvertInputError as e:  # refused before anything was written: say so
        raise ConvertInputError(f"{e}; nothing written") from None
    return 0
