"""`python -m convert --config FILE [key=value ...]`: one round's (or convert.jobs') stored
collect dirs -> micro-batches, index.json and stats.json (make convert)."""
from __future__ import annotations

from wharf import envdefaults

envdefaults.apply()  # before torch loads

import logging  # noqa: E402
import sys  # noqa: E402

from wharf.config import cli_config  # noqa: E402
from convert.reader import ConvertInputError  # noqa: E402
from convert.stage import convert_round  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    cfg = cli_config(argv, "python -m convert")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        convert_round(cfg, progress=True)
    except ConvertInputError as e:
        print(f"convert: {e}", file=sys.stderr)
        print("convert: nothing written", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
