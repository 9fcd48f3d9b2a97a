"""`python -m collect --config FILE [key=value ...]`: run one collect round (make collect)."""
from __future__ import annotations

from wharf import envdefaults

envdefaults.apply()  # before harbor and the agents load

import logging  # noqa: E402
import sys  # noqa: E402

from wharf.config import cli_config  # noqa: E402
from wharf.endpoint import EndpointError  # noqa: E402
from collect.proxy_client import ServiceError  # noqa: E402
from collect.runner import run  # noqa: E402
from collect.tasksets import TaskSetError  # noqa: E402
from collect.trials import TrialSetupError  # noqa: E402


def setup_logging() -> None:
    """Our INFO on the console; harbor and HTTP clients only from WARNING (harbor keeps its
    DEBUG for each trial's own trial.log)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    handler.addFilter(lambda r: r.levelno >= logging.WARNING or not r.name.startswith(("harbor", "httpx", "LiteLLM")))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    cfg = cli_config(argv, "python -m collect")
    setup_logging()
    try:
        summary = run(cfg)
    except (TaskSetError, TrialSetupError, ServiceError, EndpointError) as e:
        print(f"collect: {e}", file=sys.stderr)
        return 1
    out = cfg.round_layout.collect
    mean = "-" if summary.mean_reward is None else f"{summary.mean_reward:.3f}"
    print(f"round {cfg.round}: {len(summary.rows)}/{summary.planned} rollouts "
          f"({summary.resumed} resumed), status {summary.counts}, mean reward {mean}")
    print(f"groups with both a success and a failure: {len(summary.mixed_groups())} {summary.mixed_groups()}")
    print(f"wrote {out.rollouts}, {out.turns}/, {out.manifest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
