"""`python -m train --config FILE [key=value ...]`: train round `round` and publish its adapter."""
from __future__ import annotations

import logging
import sys

from collect.config import cli_config
from collect.engine.model_store import ModelError
from convert.records import BatchFormatError

from .model import AdapterError
from .stage import TrainError, train_round


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = cli_config(argv, "python -m train")
    try:
        r = train_round(cfg)
    except (TrainError, BatchFormatError, AdapterError, ModelError, ValueError) as e:
        print(f"train: {e}", file=sys.stderr)
        return 1
    mm = "n/a" if r.mismatch_mean is None else f"{r.mismatch_mean:.2e} mean, {r.mismatch_max:.2e} max"
    print(f"round {r.round}: {r.steps} steps ({r.skipped_steps} skipped), {r.loss_tokens} loss tokens, "
          f"{r.wall_s:.0f} s; first-step |logp - stored|: {mm}")
    print(f"adapter {r.policy}: {r.adapter}")
    print(r.publish_message or "not published (train.publish=false)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
