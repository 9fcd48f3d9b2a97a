"""One rollout's calls -> token-exact training rows (pure; no I/O).

Exact-prefix merge: a call joins the current row when its prompt ids start with the row so far
(the previous call's prompt + completion; by induction that is the whole row). The merged row is
then simply the last call's prompt + completion, with mask 1 on every merged call's completion
and 0 on everything between (template glue, tool output, the next user message). Where the
prefix breaks (a template re-rendering history, a truncated context, another system prompt) a
new row starts and the break is recorded with the token ids on both sides of it.

Only numpy slices and comparisons: no per-token Python loop (bench/convert.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

CONTEXT = 4  # token ids recorded on each side of a prefix break


class RowError(ValueError):
    """A call that cannot become a training row (the message names rollout and turn)."""


@dataclass
class Call:
    """One ok turn of a rollout, as stored (views into the shard's arrays, never copies)."""

    turn: int
    prompt: np.ndarray  # int32, the prompt ids the endpoint saw
    completion: np.ndarray  # int32, the ids it generated
    logprobs: np.ndarray  # float32, one per completion id
    finish_reason: str | None = "stop"
    temperature: float = 1.0


@dataclass
class RowOptions:
    max_seq_len: int = 4096
    overlong: str = "truncate"  # truncate | drop
    length_completions: str = "keep"  # keep | mask


@dataclass
class Row:
    ids: np.ndarray  # int32 [L]
    mask: np.ndarray  # float32 [L], 1 on trainable generated tokens
    logprobs: np.ndarray  # float32 [L], the call's stored log-prob where the id was generated
    turns: list[int]  # the calls merged into this row, in order
    temperature: float
    truncated: int = 0  # ids cut off at max_seq_len

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class RolloutRows:
    rows: list[Row] = field(default_factory=list)
    breaks: list[dict] = field(default_factory=list)  # one per prefix break
    duplicates: list[int] = field(default_factory=list)  # turns dropped as retried duplicates
    truncated_rows: int = 0
    dropped_overlong: int = 0  # rows dropped (overlong=drop)
    dropped_empty: int = 0  # rows with no trainable token left
    masked_length: int = 0  # finish_reason=length completions masked
    temperature_splits: int = 0


def check_call(call: Call, rollout_id: str) -> None:
    if len(call.logprobs) != len(call.completion):
        raise RowError(f"rollout {rollout_id} turn {call.turn}: {len(call.completion)} completion ids but "
                       f"{len(call.logprobs)} log-probs")
    if len(call.prompt) == 0:
        raise RowError(f"rollout {rollout_id} turn {call.turn}: an ok call with no prompt ids")


def drop_duplicates(calls: list[Call]) -> tuple[list[Call], list[int]]:
    """A retried call repeats the prompt ids of an earlier one: keep the last of each prompt."""
    last: dict[bytes, int] = {}
    for i, c in enumerate(calls):
        last[c.prompt.tobytes()] = i
    kept = sorted(last.values())
    gone = sorted(set(range(len(calls))) - set(kept))
    return [calls[i] for i in kept], [calls[i].turn for i in gone]


def extends(prev: Call, nxt: Call) -> bool:
    """Does `nxt`'s prompt start with prev.prompt + prev.completion?"""
    p, c = len(prev.prompt), len(prev.completion)
    return (len(nxt.prompt) >= p + c and np.array_equal(nxt.prompt[:p], prev.prompt)
            and np.array_equal(nxt.prompt[p:p + c], prev.completion))


def describe_break(prev: Call, nxt: Call) -> dict:
    """Where `nxt`'s prompt first differs from the row so far, with the ids on both sides."""
    row = np.concatenate([prev.prompt, prev.completion])
    m = min(len(row), len(nxt.prompt))
    diff = np.flatnonzero(row[:m] != nxt.prompt[:m])
    pos = int(diff[0]) if len(diff) else m  # m: one is a prefix of the other (a shorter prompt)
    lo, hi = max(0, pos - CONTEXT), pos + CONTEXT
    return {"turn": nxt.turn, "position": pos, "row_len": len(row), "prompt_len": len(nxt.prompt),
            "in": "last_completion" if pos >= len(prev.prompt) else "earlier",
            "row_ids": row[lo:hi].tolist(), "prompt_ids": nxt.prompt[lo:hi].tolist(), "from": lo}


def _row(calls: list[Call], opts: RowOptions, out: RolloutRows) -> None:
    last = calls[-1]
    ids = np.concatenate([last.prompt, last.completion])
    mask = np.zeros(len(ids), np.float32)
    lps = np.zeros(len(ids), np.float32)
    for c in calls:
        start = len(c.prompt)
        lps[start:start + len(c.completion)] = c.logprobs
        if c.finish_reason == "length" and opts.length_completions == "mask":
            out.masked_length += 1
        else:
            mask[start:start + len(c.completion)] = 1.0
    row = Row(ids, mask, lps, [c.turn for c in calls], last.temperature)
    if len(ids) > opts.max_seq_len:
        if opts.overlong == "drop":
            out.dropped_overlong += 1
            return
        row.truncated = len(ids) - opts.max_seq_len
        row.ids, row.mask, row.logprobs = (a[:opts.max_seq_len] for a in (ids, mask, lps))
    lps[mask == 0] = 0.0  # log-probs only where the loss reads them (records.py layout)
    if not row.mask.any():
        out.dropped_empty += 1
        return
    out.truncated_rows += row.truncated > 0
    out.rows.append(row)


def build_rows(calls: list[Call], opts: RowOptions, rollout_id: str = "?") -> RolloutRows:
    """`calls`: the rollout's ok turns sorted by turn. Every row starts with a prompt."""
    out = RolloutRows()
    for c in calls:
        check_call(c, rollout_id)
    calls, out.duplicates = drop_duplicates(calls)
    current: list[Call] = []
    for c in calls:
        if current:
            prev = current[-1]
            if c.temperature != prev.temperature:
                out.temperature_splits += 1  # one temperature per row: the trainer divides by it
            elif not extends(prev, c):
                out.breaks.append(describe_break(prev, c))
            elif opts.overlong == "drop" and len(c.prompt) + len(c.completion) > opts.max_seq_len >= \
                    len(prev.prompt) + len(prev.completion):
                pass  # keep the part that fits as a row; the overlong rest is dropped on its own
            else:
                current.append(c)
                continue
            _row(current, opts, out)
            current = []
        current.append(c)
    if current:
        _row(current, opts, out)
    return out
