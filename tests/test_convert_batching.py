"""convert.batching (length bucketing, padding) and the micro-batch files of wharf.batches."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from wharf.convert import batching
from wharf.core.batches import FORMAT, FORMAT_VERSION, PAD_ID, BatchFormatError, load_micro_batch, save_micro_batch
from wharf.convert.rows import Row


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=80), st.integers(64, 1024), st.sampled_from([1, 8, 16]),
       st.integers(0, 3), st.sampled_from([0.0, 0.25, 1.0]))
def test_every_row_once_under_the_budget(lengths, budget, multiple, seed, max_pad):
    lengths = np.array(lengths)
    plan = batching.plan_batches(lengths, budget, multiple, seed, max_pad)
    assert sorted(np.concatenate(plan).tolist()) == list(range(len(lengths)))
    for b in plan:
        t = batching.round_up(int(lengths[b].max()), multiple)
        assert len(b) * t <= budget or len(b) == 1  # a row over the budget goes alone
        assert (lengths[b] >= (1 - max_pad) * t).all() or len(b) == 1
    again = batching.plan_batches(lengths, budget, multiple, seed, max_pad)
    assert all(np.array_equal(a, b) for a, b in zip(plan, again)) and len(plan) == len(again)


def test_bucketing_pads_far_less_than_naive():
    lengths = np.random.default_rng(0).lognormal(7, 0.8, 2000).astype(int) + 1  # agent rows: a long tail
    plan = batching.plan_batches(lengths, 32768, 64, seed=1)
    naive = batching.naive_batches(len(lengths), round(len(lengths) / len(plan)), seed=1)
    bucketed, shuffled = (batching.padding_fraction(lengths, p, 64) for p in (plan, naive))
    assert bucketed < 0.05 and shuffled > 0.4, (bucketed, shuffled)
    assert not all(np.array_equal(a, b) for a, b in zip(plan, batching.plan_batches(lengths, 32768, 64, seed=2)))


def row(prompt, completion, lps, length=None):
    p = np.array(prompt, np.int32)
    c = np.array(completion, np.int32)
    n = len(p) + len(c)
    return Row(p, c, [(len(p), np.array(lps, np.float32))], [0], 0.7, length or n)


def test_pack_layout():
    rows = [row([5, 6, 7], [8, 9], [-0.1, -0.2]), row([5, 6], [3], [-0.3])]
    mb = batching.pack(rows, 4, np.array([1.5, -1.5]), np.array([1.0, 0.5]), np.array([0, 1]), np.array([0, 0]))
    assert mb.shape == (2, 8)
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 9, PAD_ID, PAD_ID, PAD_ID], [5, 6, 3] + [PAD_ID] * 5]
    assert mb.attention_mask.tolist() == [[1] * 5 + [0] * 3, [1] * 3 + [0] * 5]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 0, 0], [0, 1, 2, 0, 0, 0, 0, 0]]
    assert mb.completion_mask.tolist() == [[0, 0, 0, 1, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0, 0, 0]]
    np.testing.assert_allclose(mb.old_logprobs[0].numpy(), [0, 0, 0, -0.1, -0.2, 0, 0, 0], atol=1e-7)
    assert mb.temperatures.tolist() == pytest.approx([0.7, 0.7])
    assert mb.advantages.tolist() == [1.5, -1.5] and mb.weights.tolist() == [1.0, 0.5]


def test_records_round_trip_compact_and_legacy(tmp_path):
    mb = batching.pack([row([5, 6, 7], [8, 9], [-0.1, -0.2])], 8, np.array([1.0]), np.array([1.0]),
                       np.array([0]), np.array([0]))
    save_micro_batch(mb, tmp_path / "a.safetensors")
    back = load_micro_batch(tmp_path / "a.safetensors")
    for k, v in mb.tensors().items():
        assert back.tensors()[k].dtype == v.dtype and torch.equal(back.tensors()[k], v), k
    # stored compact: about 14 bytes a token, not 32
    assert (tmp_path / "a.safetensors").stat().st_size < 1000
    # a file written with the full dtypes (before compact storage) still loads
    save_file({k: v.contiguous() for k, v in mb.tensors().items()}, str(tmp_path / "b.safetensors"),
              metadata={"format": FORMAT, "version": str(FORMAT_VERSION)})
    legacy = load_micro_batch(tmp_path / "b.safetensors")
    assert all(torch.equal(legacy.tensors()[k], v) for k, v in mb.tensors().items())
    bad = mb.tensors()
    bad["completion_mask"] = bad["completion_mask"].clone()
    bad["completion_mask"][0, -1] = 1  # on padding
    save_file({k: v.contiguous() for k, v in bad.items()}, str(tmp_path / "c.safetensors"),
              metadata={"format": FORMAT, "version": str(FORMAT_VERSION)})
    with pytest.raises(BatchFormatError, match="completion_mask is 1 on a padding position"):
        load_micro_batch(tmp_path / "c.safetensors")
