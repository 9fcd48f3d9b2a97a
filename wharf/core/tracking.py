"""A run's metrics in the trackers people watch runs with: TensorBoard, MLflow, W&B (offline).

`train.log_with: [tensorboard, mlflow, wandb]` picks them; each needs its package (the `track`
extra: `pip install -e '.[track]'`). A wharf run has one run in each tracker, kept under
runs/<run>/trackers/ and continued by every round: its id is stored there when it is created.

Two series: `train/<metric>` per optimizer step (x: the step, numbered on across rounds), logged
by the trainer, and `round/<metric>` per round (x: the round), logged by the loop. The run's
config, credentials redacted, is recorded when a tracker's run is created.

Where each writes (nothing goes over the network):
  tensorboard  trackers/<run>/events.out.tfevents.*       tensorboard --logdir runs/<run>/trackers
  mlflow       trackers/mlruns/ (a file store; or MLFLOW_TRACKING_URI when set)
  wandb        trackers/wandb/offline-run-*/ (offline)     wandb sync runs/<run>/trackers/wandb
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import math
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from wharf.core.config_redact import redacted_mapping
from wharf.core.errors import WharfError

log = logging.getLogger("wharf.tracking")

BACKENDS = ("tensorboard", "mlflow", "wandb")
# What `train.log_with=[X]` imports, and the package that provides it (all in the `track` extra).
MODULES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow-skinny", "wandb": "wandb"}
SERIES = {"train": "step", "round": "round"}  # series -> the name of its x axis


class TrackingError(WharfError):
    """A tracker named in train.log_with cannot be used; the message says what to install."""


def check(names) -> None:
    """Refuse, before anything runs, a tracker whose package is not installed."""
    for name in names:
        if importlib.util.find_spec(MODULES[name]) is None:
            raise TrackingError(f"train.log_with names {name}, but its package is not installed: "
                                f"pip install -e '.[track]' (or pip install {PACKAGES[name]}), or drop {name}")


def flat(config: dict, prefix: str = "") -> dict[str, str | int | float | bool]:
    """A nested config as dotted scalars (lists and None as text), credentials redacted."""
    out: dict = {}
    for key, value in redacted_mapping(config).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, (int, float, str, bool)) else json.dumps(value)
    return out


def scalars(values: dict) -> dict[str, float]:
    """The finite numbers of `values` (a bool as 0/1); None, text and NaN left out."""
    out = {}
    for k, v in values.items():
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[k] = float(v)
    return out


@dataclass(frozen=True)
class TrackerRun:
    """Which trackers, where they write, and what run they record."""
    names: tuple[str, ...]
    root: Path  # runs/<run>/trackers
    name: str  # the wharf run's name: each tracker's run name
    config: dict  # flat(): what a new tracker run records as its parameters

    @classmethod
    def of(cls, cfg) -> "TrackerRun":
        """From a RunConfig (its train.log_with, its run dir, its config)."""
        return cls(tuple(cfg.train.log_with), cfg.layout.trackers, cfg.name, flat(dataclasses.asdict(cfg)))


class Tracker:
    """One tracker's run of a wharf run; opened for a stage, closed after it."""
    name: ClassVar[str]

    def __init__(self, run: TrackerRun):
        self.run = run

    def log(self, series: str, values: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def _id(self, filename: str, new) -> tuple[str, bool]:
        """The id kept in trackers/<filename>, or `new()` stored there; True when it is new."""
        path = self.run.root / filename
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip(), False
        value = new()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
        return value, True


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, run: TrackerRun):
        super().__init__(run)
        from torch.utils.tensorboard import SummaryWriter

        logdir = run.root / run.name
        first = not any(logdir.glob("events.out.tfevents.*"))
        self.writer = SummaryWriter(str(logdir))
        if first:
            self.writer.add_text("config", "\n".join(f"    {k} = {v}" for k, v in run.config.items()))

    def log(self, series, values, step):
        for k, v in values.items():
            self.writer.add_scalar(f"{series}/{k}", v, step)
        self.writer.flush()

    def close(self):
        self.writer.close()


class MLflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, run: TrackerRun):
        super().__init__(run)
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or (run.root / "mlruns").resolve().as_uri()
        self.client = _mlflow_client(MlflowClient, self.uri)
        exp = self.client.get_experiment_by_name(run.name)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(run.name)
        key = f"mlflow-run-{_digest(self.uri)}"  # another store is another run
        self.run_id, new = self._id(key, lambda: self.client.create_run(exp_id, run_name=run.name).info.run_id)
        if new:
            params = [Param(k, str(v)[:6000]) for k, v in run.config.items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params a call
                self.client.log_batch(self.run_id, params=params[i:i + 100])
        else:
            self.client.update_run(self.run_id, status="RUNNING")

    def log(self, series, values, step):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(f"{series}/{k}", v, now, step) for k, v in values.items()])

    def close(self):
        self.client.set_terminated(self.run_id)


def _mlflow_client(cls, uri: str):
    """A client of `uri`. A local file store is wanted here (MLflow 3 refuses one unless told: it
    wants a database, whose set-up costs ~10 s a run); a user's own MLFLOW_ALLOW_FILE_STORE stands."""
    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return cls(tracking_uri=uri)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, run: TrackerRun):
        super().__init__(run)
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # wharf.core.envdefaults' too: no network
        import wandb

        run_id, new = self._id("wandb-run-id", lambda: f"{run.name[:40]}-{secrets.token_hex(4)}")
        run.root.mkdir(parents=True, exist_ok=True)
        self.wb = wandb.init(mode="offline", dir=str(run.root), project=os.environ.get("WANDB_PROJECT", "wharf"),
                             name=run.name, id=run_id, resume="allow", config=run.config if new else None,
                             settings=wandb.Settings(console="off", silent=True, x_disable_stats=True))
        for series, axis in SERIES.items():
            self.wb.define_metric(axis, hidden=True)
            self.wb.define_metric(f"{series}/*", step_metric=axis)

    def log(self, series, values, step):
        self.wb.log({SERIES[series]: step, **{f"{series}/{k}": v for k, v in values.items()}})

    def close(self):
        self.wb.finish()


CLASSES: dict[str, type[Tracker]] = {c.name: c for c in (TensorBoardTracker, MLflowTracker, WandbTracker)}


class Trackers:
    """The trackers of train.log_with together. A tracker that fails is named in the log and
    dropped: a tracker never stops a run."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = trackers

    def log(self, series: str, values: dict, step: int) -> None:
        if series not in SERIES:
            raise ValueError(f"series {series!r}: one of {', '.join(SERIES)}")
        nums = scalars(values)
        for t in list(self.trackers):
            self._try(t, "log", lambda: t.log(series, nums, step))

    def close(self) -> None:
        for t in list(self.trackers):
            self._try(t, "close", t.close)
        self.trackers = []

    def _try(self, t: Tracker, what: str, fn) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001  any library error: the run goes on without it
            log.warning("tracker %s: %s failed (%s: %s); the run goes on without it", t.name, what,
                        type(e).__name__, e)
            self.trackers.remove(t)

    def __enter__(self) -> "Trackers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_trackers(run: TrackerRun) -> Trackers:
    """Every tracker of `run.names`, each continuing the wharf run's tracker run (created on first use)."""
    check(run.names)
    opened = []
    for name in run.names:
        try:
            opened.append(CLASSES[name](run))
        except Exception as e:  # noqa: BLE001
            log.warning("tracker %s: could not open its run in %s (%s: %s); the run goes on without it",
                        name, run.root, type(e).__name__, e)
    return Trackers(opened)
