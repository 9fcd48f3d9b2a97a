"""The seam between convert and train: micro-batch files and their index.

train reads only what this module defines, never the parquet. One micro-batch is one
safetensors file; `index.json` beside them lists the files in training order.

Tensor layout of a micro-batch with B rows padded to T positions (T a multiple of
`pad_multiple`). Every per-position tensor is *token-aligned*: position t describes token
`input_ids[b, t]`, not the logits that predict it.

```
position t        0    1    2    3    4    5    6    7    8    9   10   11
input_ids        sys  usr  usr  c1   c1   c1  tool tool  c2   c2  pad  pad
source           |-- prompt 1 -|--- gen 1 --|-- new ---|- gen 2 -|-- pad --|
attention_mask    1    1    1    1    1    1    1    1    1    1    0    0
position_ids      0    1    2    3    4    5    6    7    8    9    0    0
completion_mask   0    0    0    1    1    1    0    0    1    1    0    0
old_logprobs      0    0    0   lp   lp   lp    0    0   lp   lp    0    0
```

- `completion_mask[b, t] = 1` exactly where the model generated `input_ids[b, t]` (the completion
  ids the endpoint returned); prompt, template glue, tool output and padding are 0. Position 0
  is never a completion (a row always starts with a prompt).
- `old_logprobs[b, t]` is the endpoint's processed log-prob of `input_ids[b, t]` (behaviour
  policy, temperature applied), 0 where the mask is 0.
- The shift is the trainer's: logits at position t-1 score the token at t, so the loss uses
  `logits[:, :-1]` against `input_ids[:, 1:]`, `completion_mask[:, 1:]`, `old_logprobs[:, 1:]`.
- Padding is on the right: `input_ids` = `PAD_ID`, `attention_mask` = 0, `position_ids` = 0,
  masks and log-probs 0.
- On disk the files are compact (`STORAGE`: int32 ids and positions, uint8 masks, ~14 bytes a
  token instead of 32); `load_micro_batch` returns the dtypes of `TENSORS` whichever it finds.
- Per row: `advantages` (the rollout's group-relative advantage, shared by all its rows),
  `weights` (the row's loss tokens / its rollout's loss tokens over all its rows: they sum to 1
  per rollout; train's seq_mean and constant count rollouts with them, token_mean ignores them,
  so a rollout's loss is the same whether its tokens are in one row or several),
  `temperatures` (the sampling temperature the row was generated with: the trainer divides the
  logits by it), `rollout_index` and `group_index` (into the index's `rollouts` and `groups`).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import numpy as np
import orjson
from safetensors.numpy import save_file
from safetensors.torch import load_file

from wharf.core import atomic
from wharf.core.layout import ConvertPaths
from wharf.core.errors import WharfError

FORMAT = "wharf.microbatches"
FORMAT_VERSION = 2  # 2: weights are each row's share of its rollout's loss tokens
PAD_ID = 0

# name -> (dtype, per-position (True) or per-row (False))
TENSORS: dict[str, tuple[torch.dtype, bool]] = {
    "input_ids": (torch.int64, True),
    "attention_mask": (torch.int64, True),
    "position_ids": (torch.int64, True),
    "completion_mask": (torch.float32, True),
    "old_logprobs": (torch.float32, True),
    "advantages": (torch.float32, False),
    "weights": (torch.float32, False),
    "temperatures": (torch.float32, False),
    "rollout_index": (torch.int64, False),
    "group_index": (torch.int64, False),
}

# How save_micro_batch stores each tensor (values fit: ids < 2**31, masks 0/1); float32 stays.
STORAGE: dict[str, np.dtype] = {
    "input_ids": np.dtype(np.int32), "attention_mask": np.dtype(np.uint8), "position_ids": np.dtype(np.int32),
    "completion_mask": np.dtype(np.uint8), "rollout_index": np.dtype(np.int32), "group_index": np.dtype(np.int32),
}


class BatchFormatError(WharfError, ValueError):
    """A convert dir or micro-batch file that is not in the layout this module defines."""


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, T] int64
    attention_mask: torch.Tensor  # [B, T] int64
    position_ids: torch.Tensor  # [B, T] int64
    completion_mask: torch.Tensor  # [B, T] float32, 1 on generated tokens
    old_logprobs: torch.Tensor  # [B, T] float32, token-aligned behaviour log-probs
    advantages: torch.Tensor  # [B] float32
    weights: torch.Tensor  # [B] float32
    temperatures: torch.Tensor  # [B] float32
    rollout_index: torch.Tensor  # [B] int64
    group_index: torch.Tensor  # [B] int64

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)

    def to(self, device) -> "MicroBatch":
        return MicroBatch(**{k: v.to(device) for k, v in self.tensors().items()})

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in TENSORS}


@dataclass
class BatchFile:
    """One entry of index.json's `files`."""

    file: str  # relative to the convert dir
    rows: int
    seq_len: int  # T, padded
    tokens: int  # real (unpadded) tokens
    loss_tokens: int  # positions with completion_mask = 1
    rollouts: float  # the sum of the rows' weights (rollouts' worth of loss tokens)


@dataclass
class BatchIndex:
    """index.json: what train needs before it opens a file (e.g. loss tokens per optimizer step)."""

    files: list[BatchFile]
    rollouts: list[dict] = field(default_factory=list)  # rollout_index -> {rollout_id, job, group_id, reward, advantage, ...}
    groups: list[str] = field(default_factory=list)  # group_index -> group id (job-qualified)
    jobs: list[str] = field(default_factory=list)  # the collect dirs read
    pad_multiple: int = 1
    seed: int = 0
    # convert.mode that made the rows: sft rows (advantage 1, no behaviour log-probs) train only with
    # train.objective=sft (an index without the key: grpo)
    mode: str = "grpo"
    format: str = FORMAT
    version: int = FORMAT_VERSION

    @property
    def n_rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def loss_tokens(self) -> int:
        return sum(f.loss_tokens for f in self.files)


def check_batch(mb: MicroBatch, where: str) -> None:
    """Dtypes, shapes and the mask invariants of the layout above."""
    b, t = mb.input_ids.shape
    for name, (dtype, per_pos) in TENSORS.items():
        x = getattr(mb, name)
        want = (b, t) if per_pos else (b,)
        if tuple(x.shape) != want or x.dtype != dtype:
            raise BatchFormatError(f"{where}: tensor '{name}' is {x.dtype} {tuple(x.shape)}, expected {dtype} {want}")
    # numpy views of the (CPU) tensors: torch's small-op overhead made this the cost of convert
    cmask = mb.completion_mask.detach().cpu().numpy()
    attn = mb.attention_mask.detach().cpu().numpy()
    if (cmask != 0).any(where=attn == 0):
        raise BatchFormatError(f"{where}: completion_mask is 1 on a padding position")
    if t and cmask[:, 0].any():
        raise BatchFormatError(f"{where}: completion_mask is 1 at position 0 (no logits predict it)")


def save_micro_batch(mb: MicroBatch, path: Path) -> None:
    check_batch(mb, str(path))
    arrays = {k: v.detach().cpu().numpy() for k, v in mb.tensors().items()}
    save_file({k: np.ascontiguousarray(a.astype(STORAGE.get(k, a.dtype), copy=False)) for k, a in arrays.items()},
              str(path),
              metadata={"format": FORMAT, "version": str(FORMAT_VERSION)})


def load_micro_batch(path: Path) -> MicroBatch:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(path))
    except Exception as e:  # safetensors raises its own error types for truncated/foreign files
        raise BatchFormatError(f"{path}: not a readable safetensors file ({e})") from None
    if meta.get("format") != FORMAT or meta.get("version") != str(FORMAT_VERSION):
        raise BatchFormatError(f"{path}: layout {meta.get('format')!r} v{meta.get('version')}, "
                               f"this trainer reads {FORMAT} v{FORMAT_VERSION}; re-run convert")
    missing = sorted(set(TENSORS) - set(tensors))
    if missing:
        raise BatchFormatError(f"{path}: missing tensors {missing}; re-run convert")
    mb = MicroBatch(**{k: tensors[k].to(TENSORS[k][0]) for k in TENSORS})
    check_batch(mb, str(path))
    return mb


def write_index(index: BatchIndex, path: Path) -> None:
    atomic.write_bytes(path, orjson.dumps(asdict(index), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


def read_index(convert_dir: Path) -> BatchIndex:
    path = ConvertPaths(Path(convert_dir)).index
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BatchFormatError(f"{path}: no index.json; run convert on this round first") from None
    except (OSError, ValueError) as e:
        raise BatchFormatError(f"{path}: unreadable index ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != FORMAT_VERSION:
        got = (data.get("format"), data.get("version")) if isinstance(data, dict) else type(data).__name__
        raise BatchFormatError(f"{path}: layout {got}, this trainer reads {FORMAT} v{FORMAT_VERSION}; re-run convert")
    try:
        files = [BatchFile(**f) for f in data.pop("files")]
        return BatchIndex(files=files, **data)
    except (TypeError, KeyError) as e:
        raise BatchFormatError(f"{path}: malformed index ({e}); re-run convert") from None
