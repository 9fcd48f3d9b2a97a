"""`python -m train --config FILE [key=value ...]`: train round `round` and publish its adapter."""
from __future__ import annotations

from wharf import envdefaults

envdefaults.apply()  # before torch loads

import logging  # noqa: E402
import sys  # noqa: E402

from wharf.config import cli_config  # noqa: E402
from wharf.model_store import ModelError  # noqa: E402
from convert.records import BatchFormatError  # noqa: E402

from .model import AdapterError  # noqa: E402
from .stage import TrainError, train_round  # noqa: E402


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
