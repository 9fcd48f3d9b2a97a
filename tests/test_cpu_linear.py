"""wharf/cpu_linear: the C kernel gives torch's linear and its input gradient to float rounding,
for every row count (chunks included), tail and tile it handles, on AVX-512 and on AVX2; layers
take it for fp32 inference (reading swapped weights) and, under autograd, only where the weight and
bias are frozen (LoRA's base), with gradients equal to torch's, at the row counts where it was
timed faster on this machine (wharf/core/cpu_routes.py, timed once and kept); without a compiler the
model runs as it was."""
from __future__ import annotations

import logging
import shutil

import pytest
import torch

from wharf.core import cpu_linear, cpu_routes
from wharf.core.cpu_routes import Routes

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler")

SHAPES = [(576, 576), (576, 192), (1536, 576), (20, 7), (33, 13), (576, 1000)]  # (K, N): tails of both


def cpu_flags() -> str:
    return next((l for l in open("/proc/cpuinfo") if l.startswith("flags")), "")


def kernel(tmp_path, extra: list[str] = []) -> cpu_linear.Kernel:
    return cpu_linear.Kernel(cpu_linear.build(tmp_path, cpu_linear.FLAGS + extra))


def assert_matches_torch(k: cpu_linear.Kernel):
    g = torch.Generator().manual_seed(0)
    for M in (1, 2, 3, 4, 5, 7, 16, 17, 32, cpu_linear.CHUNK + 3):
        for K, N in SHAPES:
            x, w, b = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g) * 0.05, torch.randn(N, generator=g)
            for bias in (None, b):
                ref = torch.nn.functional.linear(x, w, bias)
                err = ((k.linear(x, w, bias) - ref).abs() / (ref.abs() + 1)).max().item()
                assert err < 1e-5, (M, K, N, bias is not None, err)
            dy = torch.randn(M, N, generator=g)
            ref = dy @ w
            err = ((k.linear_dx(dy, w) - ref).abs() / (ref.abs() + 1)).max().item()
            assert err < 1e-5, ("dx", M, K, N, err)


@pytest.mark.skipif(" avx512f " not in cpu_flags() and " avx2 " not in cpu_flags(), reason="neither AVX-512 nor AVX2")
def test_native_kernel_matches_torch(tmp_path):
    k = kernel(tmp_path)
    assert k.isa == (512 if " avx512f " in cpu_flags() else 256)
    assert_matches_torch(k)


@pytest.mark.skipif(" avx2 " not in cpu_flags() or " fma " not in cpu_flags(), reason="no AVX2 + FMA")
def test_avx2_kernel_matches_torch(tmp_path):
    k = kernel(tmp_path, ["-mno-avx512f"])
    assert k.isa == 256
    assert_matches_torch(k)


def test_build_is_cached_per_source_and_flags(tmp_path):
    a = cpu_linear.build(tmp_path)
    assert cpu_linear.build(tmp_path) == a and a.stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir()] == [a.name]  # nothing half-built left beside it


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 80, bias=False))


@pytest.mark.skipif(" avx2 " not in cpu_flags(), reason="no AVX2")
def test_installed_layers_take_inference_only_and_read_swapped_weights(tmp_path, monkeypatch):
    m, ref = model(), model()
    k = cpu_linear.install(m, tmp_path, routes=Routes.everywhere())
    assert k is not None
    calls = []
    real = k.linear
    monkeypatch.setattr(k, "linear", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    x = torch.randn(2, 3, 64)  # 6 rows
    with torch.no_grad():
        assert torch.allclose(m(x), ref(x), atol=1e-5) and calls == [6, 6]
        calls.clear()
        big = torch.randn(2 * cpu_linear.CHUNK + 1, 64)  # a prefill: in chunks
        assert torch.allclose(m(big), ref(big), atol=1e-5) and calls == [2 * cpu_linear.CHUNK + 1] * 2
        m[2].weight = torch.nn.Parameter(ref[2].weight * 2)  # as the adapters swap a merged weight in
        assert torch.allclose(m(x)[..., :5], 2 * ref(x)[..., :5], atol=1e-5)
    calls.clear()
    m(x).sum().backward()  # with gradients: torch's matmul, so autograd works
    assert calls == [] and m[0].weight.grad is not None


def test_frozen_layers_train_on_the_kernel_with_torchs_gradients(tmp_path, monkeypatch):
    """LoRA's shape: frozen base layers, a trainable layer between them. The frozen ones run
    forward and backward on the kernel; the gradients equal torch's; the trainable one, and any
    layer under autocast, stays on torch."""
    m, ref = model(), model()
    for net in (m, ref):
        net[0].requires_grad_(False)
        net[2].requires_grad_(False)
        net.insert(1, torch.nn.Linear(96, 96))  # trainable
    ref[1].load_state_dict(m[1].state_dict())
    k = cpu_linear.install(m, tmp_path, routes=Routes.everywhere())
    fwd, bwd = [], []
    real_fwd, real_bwd = k.linear, k.linear_dx
    monkeypatch.setattr(k, "linear", lambda x, *a: fwd.append(x.shape[0]) or real_fwd(x, *a))
    monkeypatch.setattr(k, "linear_dx", lambda dy, w: bwd.append(tuple(w.shape)) or real_bwd(dy, w))
    x = torch.randn(2, 5, 64)
    xs = [x.clone().requires_grad_(True), x.clone().requires_grad_(True)]
    for net, xi in zip((m, ref), xs):
        (net(xi) ** 2).sum().backward()
    assert fwd == [10, 10]  # the two frozen layers; the trainable one went to torch
    assert bwd == [(80, 96), (96, 64)]  # dx of both, last first
    assert torch.allclose(xs[0].grad, xs[1].grad, atol=1e-5)
    assert torch.allclose(m[1].weight.grad, ref[1].weight.grad, atol=1e-4, rtol=1e-5)
    fwd.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        m(x)
    assert fwd == []
    with torch.no_grad():  # a rank-16 LoRA A: narrower than MIN_DIM, torch's
        assert not cpu_linear.usable(torch.randn(3, 96), torch.randn(16, 96), None)
        assert cpu_linear.usable(torch.randn(3, 96), torch.randn(64, 96), None)


def test_install_aligns_weights_that_sit_off_a_cache_line(tmp_path):
    """A weight viewed at an odd offset of a buffer (as safetensors loads them) gets aligned storage
    with the same values; a tied weight stays one tensor."""
    m = model()
    buf = torch.zeros(96 * 64 + 10)
    w = buf[10:10 + 96 * 64].view(96, 64)  # 40 bytes off a 64-byte line
    w.copy_(m[0].weight.detach())
    m[0].weight = torch.nn.Parameter(w)
    before = m[0].weight.detach().clone()
    assert m[0].weight.data_ptr() % 64 == 40
    cpu_linear.install(m, tmp_path)
    assert m[0].weight.data_ptr() % 64 == 0 and torch.equal(m[0].weight, before)


def test_without_a_compiler_the_model_runs_as_it_was(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    m = model()
    forwards = [l.forward for l in m if isinstance(l, torch.nn.Linear)]
    with caplog.at_level(logging.WARNING, logger="wharf"):
        assert cpu_linear.install(m, tmp_path / "cache") is None
    assert "linear layers run on torch's matmul" in caplog.text and "no-such-cc" in caplog.text
    assert [l.forward for l in m if isinstance(l, torch.nn.Linear)] == forwards


def test_each_call_goes_by_the_timed_row_count_nearest_its_own(tmp_path, monkeypatch):
    """Where torch was faster (here: 1 row, and 64 and more), the layer calls torch's matmul."""
    routes = Routes(cpu_routes.BUCKETS, torch_ms=(1.0, 2.0, 3.0, 4.0, 5.0), kernel_ms=(2.0, 1.0, 1.0, 5.0, 6.0))
    assert [routes.use_kernel(m) for m in (1, 2, 3, 16, 31, 40, 128, 5000)] == \
        [False, False, True, True, True, False, False, False]  # 2: as near 1 as 4 (log scale)
    assert routes.describe().startswith("kernel at 4, 16 rows, torch's matmul at 1, 64, 256+")
    m, ref = model(), model()
    k = cpu_linear.install(m, tmp_path, routes=routes)
    calls = []
    real = k.linear
    monkeypatch.setattr(k, "linear", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    with torch.no_grad():
        for rows in (1, 6, 300):
            x = torch.randn(rows, 64)
            assert torch.allclose(m(x), ref(x), atol=1e-5)
    assert calls == [6, 6]


def test_routes_are_timed_once_per_machine_and_read_after(tmp_path, monkeypatch, caplog):
    lib = cpu_linear.build(tmp_path)
    k = cpu_linear.Kernel(lib)
    weights = [torch.randn(96, 64), torch.randn(80, 96)]
    torch.manual_seed(7)
    first = cpu_routes.routes_for(lib, k.linear, weights)
    after = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(after, torch.rand(3))  # a trainer's seeded RNG goes on as if nothing was timed
    assert first.rows == cpu_routes.BUCKETS and all(t > 0 for t in first.torch_ms + first.kernel_ms)
    (saved,) = tmp_path.glob("*.routes.json")
    assert f"-t{torch.get_num_threads()}." in saved.name  # another thread count is timed again

    def fail(*a):
        raise AssertionError("timed again")
    monkeypatch.setattr(cpu_routes, "measure", fail)
    assert cpu_routes.routes_for(lib, k.linear, weights) == first
    saved.write_text("{not json")  # a cut file: timed again, not an error
    monkeypatch.undo()
    assert cpu_routes.routes_for(lib, k.linear, weights).rows == cpu_routes.BUCKETS
    with caplog.at_level(logging.INFO, logger="wharf"):
        cpu_linear.install(model(), tmp_path)
    assert "where it is faster here: kernel at" in caplog.text and "torch/kernel time" in caplog.text
