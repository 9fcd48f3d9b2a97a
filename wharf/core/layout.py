"""Where a run lives on disk: the one owner of the run directory's layout.

```
runs/<run>/
  config.yaml
  rounds/<k>/collect/   turns/part-*.parquet, rollouts.parquet, manifest.json, config.yaml, harbor/, logs/
  rounds/<k>/convert/   micro-batches (safetensors), index.json, stats.json
  rounds/<k>/train/     metrics.jsonl, checkpoint/, adapter/ (policy-v<k+1>), optimizer.pt, result.json, shift.json,
                        offpolicy.json (replay), prox-rank<r>.safetensors (while training)
  rounds/<k>/health.json  the loop's checks of the round
  rounds/<k>/done/      the loop's stage markers: collect.json, convert.json, train.json, publish.json, eval.json
  evals/<eval>/summary.json           `wharf eval`'s figures per policy and the paired differences
  evals/<eval>/<policy>/rounds/0/collect/   each policy's trials: a one-round run of its own (a normal
                                      collect job: turns, rollouts, manifest, harbor trials)
  report.html, report/*.png
```

Every stage and tool (collect, the proxy, the audit, convert, train, the loop) asks this module
for paths instead of joining strings of its own. A runs_dir in object storage (`s3://bucket/runs`)
is laid out the same under its local mirror (wharf/core/storage.py): the stages pull and push it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wharf.core import storage
from wharf.core.names import policy_name, policy_version, run_tag  # noqa: F401  (their old home)


def init_adapter_dir(spec: str | None) -> Path | None:
    """loop.init_adapter -> the adapter dir it names: `<run dir>:<k>` is policy-v<k> of that run
    (the adapter its round k-1 trained), anything else a dir; None: no warm start."""
    if not spec:
        return None
    head, sep, tail = spec.rpartition(":")
    if sep and tail.isdigit() and int(tail) > 0:
        return RunLayout(Path(head)).round(int(tail) - 1).train.adapter
    return Path(spec)


WAL_DIR = "_wal"


def wal_dir(turns: Path) -> Path:
    """The proxy's write-ahead log and rollout registry, beside the shards it folds into (on the
    node's local disk also when the run is in object storage: it is never uploaded)."""
    return Path(turns) / WAL_DIR


def admin_file(wal: Path) -> Path:
    """The proxy's admin URL and token (JSON, mode 0600), for the runner and for a person's curl."""
    return Path(wal) / "admin.json"


def registry_file(wal: Path) -> Path:
    """The proxy's rollout registry (JSON lines), beside its WAL segments."""
    return Path(wal) / "rollouts.jsonl"


def adapter_config(adapter: Path) -> Path:
    """A LoRA adapter dir's config, as peft writes it and vLLM's /v1/load_lora_adapter reads it."""
    return Path(adapter) / "adapter_config.json"


def adapter_weights(adapter: Path) -> Path:
    return Path(adapter) / "adapter_model.safetensors"


# What convert reads of a collect dir (a job): what is pulled of one in object storage.
JOB_FILES = ("manifest.json", "rollouts.parquet", "turns/part-*.parquet")


def has_adapter(adapter: Path) -> bool:
    """Whether `adapter` holds an adapter (written atomically: its config is there only when it is whole)."""
    return adapter_config(adapter).is_file()


@dataclass(frozen=True)
class CollectPaths:
    root: Path  # runs/<run>/rounds/<k>/collect (or any stored collect dir)

    @property
    def turns(self) -> Path:
        return self.root / "turns"

    @property
    def wal(self) -> Path:
        return wal_dir(self.turns)

    @property
    def rollouts(self) -> Path:
        return self.root / "rollouts.parquet"

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def harbor(self) -> Path:
        return self.root / "harbor"

    def trial(self, rollout_id: str) -> Path:
        """A rollout's harbor trial dir (harbor names it by the trial name, our rollout id)."""
        return self.harbor / rollout_id

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def config(self) -> Path:
        """The round's resolved config, as it was run."""
        return self.root / "config.yaml"

    @property
    def proxy_config(self) -> Path:
        """The config the round's proxy process was started with (config plus its proxy.out_dir)."""
        return self.logs / "proxy.yaml"


@dataclass(frozen=True)
class ConvertPaths:
    root: Path  # runs/<run>/rounds/<k>/convert

    @property
    def index(self) -> Path:
        return self.root / "index.json"

    @property
    def stats(self) -> Path:
        return self.root / "stats.json"


@dataclass(frozen=True)
class TrainPaths:
    root: Path  # runs/<run>/rounds/<k>/train

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def adapter(self) -> Path:
        return self.root / "adapter"

    @property
    def result(self) -> Path:
        """train's TrainResult (wharf/train/records.py), written when the round's training ends."""
        return self.root / "result.json"

    @property
    def optimizer(self) -> Path:
        """AdamW's state and step count after the round, resumed by the next (train.resume_optimizer)."""
        return self.root / "optimizer.pt"

    @property
    def offpolicy(self) -> Path:
        """replay's per-job off-policy statistics."""
        return self.root / "offpolicy.json"

    def prox(self, rank: int) -> Path:
        """Process `rank`'s proximal log-probs, kept while the round trains (a resume reloads them)."""
        return self.root / f"prox-rank{rank}.safetensors"

    def prox_files(self) -> list[Path]:
        return sorted(self.root.glob("prox-rank*.safetensors"))

    @property
    def shift(self) -> Path:
        """How far the new adapter moved the policy on the round's own tokens (the loop's health)."""
        return self.root / "shift.json"


@dataclass(frozen=True)
class RoundLayout:
    root: Path  # runs/<run>/rounds/<k>
    k: int

    @property
    def collect(self) -> CollectPaths:
        return CollectPaths(self.root / "collect")

    @property
    def convert(self) -> ConvertPaths:
        return ConvertPaths(self.root / "convert")

    @property
    def train(self) -> TrainPaths:
        return TrainPaths(self.root / "train")

    @property
    def health(self) -> Path:
        """The loop's health checks of this round (wharf/pipeline/health.py), passed or not."""
        return self.root / "health.json"

    def marker(self, stage: str) -> Path:
        """The loop's done marker of one stage of this round (JSON: wall time, what it made)."""
        return self.root / "done" / f"{stage}.json"


@dataclass(frozen=True)
class RunLayout:
    root: Path  # runs/<run>

    @classmethod
    def of(cls, runs_dir: str | Path, name: str) -> "RunLayout":
        return cls(storage.local_path(runs_dir) / name)

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    @property
    def report_assets(self) -> Path:
        """The report's plots (PNG), referenced from report.html by relative paths."""
        return self.root / "report"

    @property
    def trackers(self) -> Path:
        """Where train.log_with's trackers (wharf/core/tracking.py) write: one tracker run per run dir."""
        return self.root / "trackers"

    @property
    def evals(self) -> Path:
        return self.root / "evals"

    def eval(self, name: str) -> "EvalLayout":
        return EvalLayout(self.evals / name)

    def round(self, k: int) -> RoundLayout:
        return RoundLayout(self.root / "rounds" / str(k), k)

    @property
    def tag(self) -> str:
        """The prefix of this run's policy names on a fleet (wharf/core/names.py)."""
        return run_tag(self.root)

    def policy(self, k: int) -> str:
        """policy-v<k> of this run as replicas serve it: `<tag>-policy-v<k>`."""
        return policy_name(k, self.tag)

    def published(self, policy: str) -> Path:
        """Which replicas took `policy` when it was published (wharf/core/replicas.py)."""
        return self.root / "published" / f"{policy}.json"

    def rounds(self) -> list[int]:
        """The round numbers that exist on disk, in order."""
        base = self.root / "rounds"
        if not base.is_dir():
            return []
        return sorted(int(p.name) for p in base.iterdir() if p.is_dir() and p.name.isdigit())


@dataclass(frozen=True)
class EvalLayout:
    root: Path  # runs/<run>/evals/<eval>

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    def policy(self, label: str) -> RunLayout:
        """A policy's trials as a one-round run (runs_dir = this eval's dir, name = the label): the
        collect round machinery writes it unchanged, and convert, audit and report read it."""
        return RunLayout(self.root / label)
