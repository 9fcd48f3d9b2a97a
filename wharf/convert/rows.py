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
from functools import cached_property

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
    length_completions: str = "mask"  # keep | mask (cut at max_tokens: kept as context, loss 0)
    context_exceeded: str = "mask"  # keep | mask (a rollout that ran out of context: in its group, loss 0)


@dataclass
class Row:
    """A row, kept as views of its calls until a micro-batch is filled (no per-row copies):
    ids = the last call's prompt + completion, cut at `length`; mask 1 on `spans`."""

    prompt: np.ndarray  # the last call's prompt ids (it starts with every earlier call's)
    completion: np.ndarray  # the last call's completion ids
    spans: list[tuple[int, np.ndarray]]  # (start, log-probs) of each trainable completion
    turns: list[int]  # the calls merged into this row, in order
    temperature: float
    length: int = 0  # len(ids) after truncation
    truncated: int = 0  # ids cut off at max_seq_len

    def __len__(self) -> int:
        return self.length

    @cached_property
    def trainable(self) -> int:  # read once `length` is final
        return sum(max(0, min(len(lp), self.length - s)) for s, lp in self.spans)

    def fill(self, ids: np.ndarray, mask: np.ndarray, logprobs: np.ndarray) -> None:
        """Write the row into zeroed buffers of at least `length` positions."""
        p = min(len(self.prompt), self.length)
        ids[:p] = self.prompt[:p]
        ids[p:self.length] = self.completion[:self.length - p]
        for s, lp in self.spans:
            n = max(0, min(len(lp), self.length - s))
            mask[s:s + n] = 1
            logprobs[s:s + n] = lp[:n]

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids, mask, lps = np.zeros(self.length, np.int32), np.zeros(self.length, np.float32), np.zeros(self.length, np.float32)
        self.fill(ids, mask, lps)
        return ids, mask, lps

    ids = property(lambda self: self.arrays()[0])
    mask = property(lambda self: self.arrays()[1])
    logprobs = property(lambda self: self.arrays()[2])


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
    repeated_answers: int = 0  # kept calls whose answer repeats the previous one (repeated_answers)
    cut_answers: int = 0  # kept calls cut at max_tokens (finish_reason length), masked or trained
    # loss tokens each rule took out: length completions masked, rows dropped overlong, the part
    # of rows cut at max_seq_len, retried duplicates dropped
    masked_length_tokens: int = 0
    dropped_overlong_tokens: int = 0
    truncated_tokens: int = 0
    duplicate_tokens: int = 0


def check_call(call: Call, rollout_id: str) -> None:
    if len(call.logprobs) != len(call.completion):
        raise RowError(f"rollout {rollout_id} turn {call.turn}: {len(call.completion)} completion ids but "
                       f"{len(call.logprobs)} log-probs")
    if len(call.prompt) == 0:
        raise RowError(f"rollout {rollout_id} turn {call.turn}: an ok call with no prompt ids")


def drop_duplicates(calls: list[Call]) -> tuple[list[Call], list[int]]:
    """A retried call repeats the prompt ids of an earlier one: keep the last of each prompt. An
    earlier call that a call before its repeat built on (that call's prompt extends its prompt +
    completion) is no retry but a step the agent took and came back from: it stays. Prompts are
    compared only when their length and end ids agree (no hashing of every prompt)."""
    keep = [True] * len(calls)
    seen: dict[tuple, list[tuple[np.ndarray, int]]] = {}
    for i in range(len(calls) - 1, -1, -1):  # later calls win
        p = calls[i].prompt
        same = seen.setdefault((len(p), int(p[0]) if len(p) else -1, int(p[-1]) if len(p) else -1), [])
        j = next((j for q, j in reversed(same) if np.array_equal(p, q)), None)  # the nearest repeat
        if j is not None:
            keep[i] = any(extends(calls[i], c) for c in calls[i + 1:j])
        same.append((p, i))
    return [c for c, k in zip(calls, keep) if k], [c.turn for c, k in zip(calls, keep) if not k]


def repeated_answers(calls: list[Call]) -> int:
    """Calls whose answer repeats the previous call's token for token: an agent stuck in a loop
    (a small policy's usual collapse under RL: it re-sends its last action)."""
    return sum(np.array_equal(a.completion, b.completion) for a, b in zip(calls, calls[1:]))


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
    spans = []
    for c in calls:
        if c.finish_reason == "length" and opts.length_completions == "mask":
            out.masked_length += 1  # stays in the row as context, loss 0
            out.masked_length_tokens += len(c.completion)
        elif len(c.completion):
            spans.append((len(c.prompt), c.logprobs))
    full = len(last.prompt) + len(last.completion)
    row = Row(last.prompt, last.completion, spans, [c.turn for c in calls], last.temperature, full)
    before = sum(len(lp) for _, lp in spans)
    if full > opts.max_seq_len:
        if opts.overlong == "drop":
            out.dropped_overlong += 1
            out.dropped_overlong_tokens += before
            return
        row.length, row.truncated = opts.max_seq_len, full - opts.max_seq_len
    out.truncated_tokens += before - row.trainable
    if not row.trainable:
        out.dropped_empty += 1
        return
    out.truncated_rows += row.truncated > 0
    out.rows.append(row)


def build_rows(calls: list[Call], opts: RowOptions, rollout_id: str = "?") -> RolloutRows:
    """`calls`: the rollout's ok turns sorted by turn. Every row starts with a prompt."""
    out = RolloutRows()
    for c in calls:
        check_call(c, rollout_id)
    kept, out.duplicates = drop_duplicates(calls)
    dup = set(out.duplicates)
    out.duplicate_tokens = sum(len(c.completion) for c in calls if c.turn in dup)
    calls = kept
    out.repeated_answers = repeated_answers(calls)
    out.cut_answers = sum(c.finish_reason == "length" for c in calls)
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
