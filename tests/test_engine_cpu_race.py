"""wharf/engine/cpu_race.c: the sampling race with torch's very draws.

The kernel must pick, for every row, the token torch's exponential race picks from the same
generator, and leave the generator where torch's exponential_ leaves it, or seeded requests would
no longer replay. These tests compare the two on many rows, vocabulary sizes, temperatures and
masked tokens, on AVX-512 and on an AVX2 build, and check the engine falls back when it cannot.
"""
from __future__ import annotations

import ctypes
import logging
import shutil

import pytest
import torch

from wharf.engine import cpu_race
from wharf.core import cbuild
from wharf.engine.cpu_race import torch_race
from wharf.engine.sampling import sample_rows


@pytest.fixture(scope="module", params=[[], ["-mno-avx512f"]], ids=["native", "avx2"])
def race(request, tmp_path_factory):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    return cpu_race.Race(cbuild.build(cpu_race.SOURCE, tmp_path_factory.mktemp("k"), cbuild.FLAGS + request.param))


def rows(seed: int, n: int, vocab: int, sharp: float, masked: bool) -> torch.Tensor:
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * sharp
    if masked:  # top-p / min_tokens leave -inf behind: probability exactly 0
        logits[:, ::3] = float("-inf")
    return torch.softmax(logits, -1)


@pytest.mark.parametrize("vocab", [1, 7, 64, 65, 4099, 49152])
def test_same_tokens_and_generator_states_as_torch(race, vocab):
    for trial, (sharp, masked) in enumerate([(1.0, False), (4.0, True), (12.0, False), (0.3, True)]):
        p = rows(trial, 6, vocab, sharp, masked and vocab > 1)
        ours = [torch.Generator().manual_seed(50 * trial + k) for k in range(6)]
        theirs = [torch.Generator().manual_seed(50 * trial + k) for k in range(6)]
        for _ in range(3):  # on from where the last draw left each generator
            assert torch.equal(race.draw(p, list(range(6)), ours), torch_race(p, theirs))
        assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(ours, theirs))


def test_rows_are_picked_by_index(race):
    """Only the listed rows are drawn, each from its own generator."""
    p = rows(3, 5, 1000, 2.0, False)
    got = race.draw(p, [4, 1], [torch.Generator().manual_seed(9), torch.Generator().manual_seed(8)])
    want = torch_race(p[[4, 1]], [torch.Generator().manual_seed(9), torch.Generator().manual_seed(8)])
    assert torch.equal(got, want)


def test_sample_rows_is_the_same_with_and_without_the_kernel(race):
    lp = torch.log_softmax(torch.randn(8, 3000, generator=torch.Generator().manual_seed(1)) * 3, -1)
    temps = [1.0, 0.0, 0.7, 1.0, 0.0, 1.3, 1.0, 0.5]
    a = sample_rows(lp, temps, [torch.Generator().manual_seed(k) for k in range(8)], race)
    b = sample_rows(lp, temps, [torch.Generator().manual_seed(k) for k in range(8)], None)
    assert torch.equal(a, b)
    assert a[1] == lp[1].argmax() and a[4] == lp[4].argmax()  # greedy rows take the argmax


def test_a_state_it_does_not_know_changes_nothing(race):
    """Bytes whose mt19937 fields make no sense (left = 0) are refused whole: -1, not a draw."""
    bad = torch.Generator().manual_seed(3).get_state()
    bad[8:12] = 0
    p = rows(0, 1, 100, 1.0, False)
    out = torch.empty(1, dtype=torch.long)
    before = bad.clone()
    rc = race.lib.wharf_race_rows(p.data_ptr(), torch.tensor([0]).data_ptr(), 1, 100,
                                  (ctypes.c_void_p * 1)(bad.data_ptr()), out.data_ptr(), 1)
    assert rc == -1 and torch.equal(bad, before)


def test_load_falls_back_when_it_disagrees_or_cannot_build(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(cpu_race.Race, "agrees_with_torch", lambda self: False)
    with caplog.at_level(logging.WARNING, logger="wharf.engine"):
        assert cpu_race.load(tmp_path) is None
    assert "does not draw as this torch" in caplog.text
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(cpu_race, "SOURCE", tmp_path / "x.c")
    (tmp_path / "x.c").write_text("int broken(")
    with caplog.at_level(logging.WARNING, logger="wharf.engine"):
        assert cpu_race.load(tmp_path / "k") is None
    assert "race kernel is off" in caplog.text
