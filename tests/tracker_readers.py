"""Each tracker's files read back by its own library: TensorBoard's EventAccumulator, an MLflow
client on the file store, W&B's `wandb leet inspect --json` on the offline run dirs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def tensorboard(trackers: Path, run: str):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(trackers / run))
    events.Reload()
    return events


def tb_series(trackers: Path, run: str, tag: str) -> list[tuple[int, float]]:
    return [(e.step, round(e.value, 6)) for e in tensorboard(trackers, run).Scalars(tag)]  # stored as float32


def mlflow_runs(trackers: Path, run: str, monkeypatch) -> list:
    """The runs of experiment `run` in trackers/mlruns (MLflow 3 opens a file store only when allowed)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(trackers / "mlruns").resolve().as_uri())
    exp = client.get_experiment_by_name(run)
    return [] if exp is None else client.search_runs([exp.experiment_id])


def mlflow_series(trackers: Path, run: str, key: str, monkeypatch) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    (found,) = mlflow_runs(trackers, run, monkeypatch)
    client = MlflowClient(tracking_uri=(trackers / "mlruns").resolve().as_uri())
    return sorted((m.step, round(m.value, 6)) for m in client.get_metric_history(found.info.run_id, key))


def wandb_records(trackers: Path) -> list[list[dict]]:
    """The records of each offline run dir (one per stage that logged), oldest first."""
    out = []
    for d in sorted((trackers / "wandb").glob("offline-run-*")):
        text = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(d)], check=True,
                              capture_output=True, text=True, timeout=120).stdout
        out.append([json.loads(line) for line in text.splitlines() if line.strip()])
    return out


def wandb_series(records: list[list[dict]], key: str, axis: str) -> list[tuple[int, float]]:
    return [(int(h["history"]["item"][axis]), round(h["history"]["item"][key], 6)) for recs in records for h in recs
            if h.get("type") == "history" and key in h["history"]["item"]]
