"""What train leaves for the loop and the report to read: TrainResult, as result.json
(TrainPaths.result). Light on purpose (no torch): the report reads it without loading a model."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from wharf.core import atomic


@dataclass
class TrainResult:
    round: int
    policy: str  # the name the adapter is published under (policy-v<k+1>)
    adapter: str
    steps: int
    skipped_steps: int
    loss_tokens: int
    mismatch_mean: float | None  # |recomputed - stored| log-prob at the first step
    mismatch_max: float | None
    wall_s: float
    published: bool = False
    publish_message: str = ""

    def write(self, path: Path) -> None:
        """Atomically: a reader sees the old result or the whole new one."""
        atomic.write_json(path, dataclasses.asdict(self))

    @classmethod
    def read(cls, path: Path) -> "TrainResult":
        """The record at `path`; keys this version does not know (a newer writer's) are left out."""
        data = json.loads(Path(path).read_text())
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
