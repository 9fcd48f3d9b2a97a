"""convert.rows: property tests over generated rollouts (prefix breaks, tool calls, retried
duplicates, truncation) and a few hand-made cases."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wharf.convert.rows import Call, RowError, RowOptions, build_rows

ids = st.lists(st.integers(1, 60), max_size=6)


@st.composite
def rollouts(draw):
    """Calls as an agent makes them: each prompt extends the history (glue, tool output, a user
    message), re-renders it (a changed or cut token: a prefix break), or repeats the last prompt
    (a retry)."""
    history = draw(st.lists(st.integers(1, 60), min_size=1, max_size=8))  # system + task
    calls = []
    for turn in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(["extend", "extend", "break", "cut", "retry"])) if calls else "extend"
        if kind == "retry":
            prompt = list(calls[-1].prompt)
        elif kind == "break" and history:
            prompt = list(history) + draw(ids)
            prompt[draw(st.integers(0, len(prompt) - 1))] = 61  # an id the generator never uses
        elif kind == "cut" and len(history) > 1:
            prompt = list(history[:draw(st.integers(1, len(history) - 1))])
        else:
            prompt = list(history) + draw(ids)  # glue / tool output / next user message
        completion = draw(st.lists(st.integers(1, 60), max_size=7))
        lp = [-(turn * 100 + j + 1) / 1000 for j in range(len(completion))]
        finish = draw(st.sampled_from(["stop", "stop", "tool_calls", "length"]))
        calls.append(Call(turn, np.array(prompt, np.int32), np.array(completion, np.int32),
                          np.array(lp, np.float32), finish, 0.7))
        history = prompt + completion
    return calls


def kept_calls(calls):
    """A call is a retried duplicate when a later call repeats its prompt and no call in between
    built on it (started with its prompt + completion)."""
    def built_on(i, k):
        row = list(calls[i].prompt) + list(calls[i].completion)
        return list(calls[k].prompt[:len(row)]) == row

    kept = []
    for i, c in enumerate(calls):
        j = next((j for j in range(i + 1, len(calls)) if list(calls[j].prompt) == list(c.prompt)), None)
        if j is None or any(built_on(i, k) for k in range(i + 1, j)):
            kept.append(c)
    return kept


@settings(max_examples=300, deadline=None)
@given(rollouts())
def test_rows_reproduce_every_call(calls):
    out = build_rows(calls, RowOptions(max_seq_len=10_000, length_completions="keep"))
    kept = kept_calls(calls)
    by_turn = {c.turn: c for c in kept}
    assert sorted(out.duplicates) == sorted(set(c.turn for c in calls) - set(by_turn))
    seen_turns = [t for r in out.rows for t in r.turns]
    # calls whose completion is empty may leave no row behind; every other kept call is in exactly one
    assert seen_turns == sorted(seen_turns)
    assert [c.turn for c in kept if len(c.completion)] == [t for t in seen_turns if len(by_turn[t].completion)]
    masked_in = np.concatenate([r.ids[r.mask == 1] for r in out.rows] or [np.zeros(0, np.int32)])
    assert masked_in.tolist() == [t for c in kept for t in c.completion.tolist()]
    for r in out.rows:
        assert r.mask[0] == 0  # a row starts with a prompt
        expect_mask = np.zeros(len(r), np.float32)
        expect_lp = np.zeros(len(r), np.float32)
        for t in r.turns:
            c = by_turn[t]
            p, n = len(c.prompt), len(c.completion)
            assert np.array_equal(r.ids[:p], c.prompt)  # the prefix the endpoint saw
            assert np.array_equal(r.ids[p:p + n], c.completion)
            expect_mask[p:p + n] = 1
            expect_lp[p:p + n] = c.logprobs
        assert np.array_equal(r.mask, expect_mask)
        assert np.array_equal(r.logprobs, expect_lp)  # the call's own log-probs, 0 elsewhere
    # a new row starts exactly at each prefix break
    assert len(out.rows) + out.dropped_empty == len(out.breaks) + 1


@settings(max_examples=200, deadline=None)
@given(rollouts(), st.integers(2, 30), st.sampled_from(["truncate", "drop"]))
def test_overlong_rows(calls, max_len, overlong):
    out = build_rows(calls, RowOptions(max_seq_len=max_len, overlong=overlong, length_completions="keep"))
    by_turn = {c.turn: c for c in kept_calls(calls)}
    for r in out.rows:
        assert len(r) <= max_len
        full = np.concatenate([by_turn[r.turns[-1]].prompt, by_turn[r.turns[-1]].completion])
        assert np.array_equal(r.ids, full[:len(r)])
        assert r.truncated == len(full) - len(r)
        if overlong == "drop":
            assert r.truncated == 0
        for t in r.turns:  # what is left of each call is still its own ids and log-probs
            c = by_turn[t]
            p = len(c.prompt)
            n = max(0, min(len(c.completion), len(r) - p))
            assert np.array_equal(r.ids[p:p + n], c.completion[:n])
            assert np.array_equal(r.logprobs[p:p + n], c.logprobs[:n])
            assert r.mask[p:p + n].all()
        assert r.mask.any()
    assert out.truncated_rows == sum(r.truncated > 0 for r in out.rows)


@settings(max_examples=100, deadline=None)
@given(rollouts())
def test_length_completions_masked(calls):
    out = build_rows(calls, RowOptions(max_seq_len=10_000, length_completions="mask"))
    by_turn = {c.turn: c for c in kept_calls(calls)}
    for r in out.rows:
        for t in r.turns:
            c = by_turn[t]
            p, n = len(c.prompt), len(c.completion)
            assert np.array_equal(r.ids[p:p + n], c.completion)  # kept as context
            assert r.mask[p:p + n].all() == (c.finish_reason != "length") or n == 0
            if c.finish_reason == "length":
                assert not r.logprobs[p:p + n].any()


def call(turn, prompt, completion, finish="stop", temp=1.0):
    return Call(turn, np.array(prompt, np.int32), np.array(completion, np.int32),
                np.full(len(completion), -0.5, np.float32), finish, temp)


def test_merge_and_break_by_hand():
    calls = [call(0, [1, 2], [3, 4]), call(1, [1, 2, 3, 4, 9], [5]),  # extends: merged
             call(2, [1, 2, 3, 7, 9, 5, 8], [6])]  # re-tokenized the first completion: break
    out = build_rows(calls, RowOptions())
    assert [r.turns for r in out.rows] == [[0, 1], [2]]
    assert out.rows[0].ids.tolist() == [1, 2, 3, 4, 9, 5]
    assert out.rows[0].mask.tolist() == [0, 0, 1, 1, 0, 1]
    (b,) = out.breaks
    assert (b["turn"], b["position"], b["in"]) == (2, 3, "earlier")
    assert b["row_ids"] == [1, 2, 3, 4, 9, 5] and b["prompt_ids"] == [1, 2, 3, 7, 9, 5, 8]


def test_retry_keeps_the_last_and_temperature_splits():
    calls = [call(0, [1, 2], [3]), call(1, [1, 2], [4]), call(2, [1, 2, 4, 5], [6], temp=0.5)]
    out = build_rows(calls, RowOptions())
    assert out.duplicates == [0]
    assert [r.turns for r in out.rows] == [[1], [2]] and out.temperature_splits == 1
    assert [r.temperature for r in out.rows] == [1.0, 0.5]


def test_a_call_a_later_turn_built_on_is_no_retry():
    # turn 1 extends turn 0; turn 2 starts over from turn 0's prompt: turn 0 was answered and used
    calls = [call(0, [1, 2], [3]), call(1, [1, 2, 3, 4], [5]), call(2, [1, 2], [6])]
    out = build_rows(calls, RowOptions())
    assert out.duplicates == [] and [r.turns for r in out.rows] == [[0, 1], [2]]
    assert out.rows[0].mask.tolist() == [0, 0, 1, 0, 1]


def test_bad_calls_name_the_rollout():
    bad = Call(3, np.array([1], np.int32), np.array([2, 3], np.int32), np.array([-1.0], np.float32))
    with pytest.raises(RowError, match="rollout r7 turn 3: 2 completion ids but 1 log-probs"):
        build_rows([bad], RowOptions(), "r7")
    with pytest.raises(RowError, match="no prompt ids"):
        build_rows([call(0, [], [1])], RowOptions(), "r7")
