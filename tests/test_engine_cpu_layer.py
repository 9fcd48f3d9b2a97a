"""The layer kernel (wharf/engine/cpu_layer.py): decode steps on it draw what the model's own layers
draw, with log-probs equal to float rounding, at several rows of different lengths; passes it
cannot do exactly go to the model."""
from __future__ import annotations

import shutil

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from wharf.engine import cpu_layer
from wharf.engine.kv import SlackLayer
from wharf.engine.sampling import SamplingParams
from wharf.engine.sequence import Sequence
from wharf.core import cbuild, cpu_linear, model_store
from wharf.core.config import EngineConfig
from test_cpu_linear import cpu_flags, kernel


@pytest.fixture(scope="module")
def core():
    from wharf.engine.core import EngineCore

    c = EngineCore(EngineConfig(device="cpu", prefix_cache=False))
    if c.layer_kernel is None:
        pytest.skip("the layer kernel could not be built here (no C compiler or no AVX2)")
    return c


def decode(core, kernel, lengths: list[int], tokens: int = 10):
    """Each step's logits [B, V] and each sequence's tokens, rows of the given prompt lengths,
    decode steps on `kernel` (None: the model's own layers)."""
    b = core.batcher
    b._decode = kernel
    text = core.tok("a careful agent reads the log, then runs one command at a time. " * 40)["input_ids"]
    seqs = [Sequence(list(text[:n]), SamplingParams(temperature=1.0, max_tokens=tokens, ignore_eos=True, seed=i),
                     emit=lambda e: None) for i, n in enumerate(lengths)]
    steps, forward = [], b._forward

    def recorded(*args):
        logits, cache = forward(*args)
        steps.append(logits.clone())
        return logits, cache
    b._forward = recorded
    try:
        torch.set_grad_enabled(False)
        b._admit(seqs)
        while b.running:
            b._decode_step()
    finally:
        del b._forward
        b._decode = core.layer_kernel
        torch.set_grad_enabled(True)
    return steps, [s.output_ids for s in seqs]


@pytest.mark.parametrize("lengths", [[300], [40, 171, 95], [60 + 7 * i for i in range(9)]])
def test_decode_steps_match_the_models_own_layers(core, lengths):
    assert_matches_the_model(core, core.layer_kernel, lengths)


def assert_matches_the_model(core, kernel, lengths):
    served = kernel.steps
    want, want_ids = decode(core, None, lengths)
    got, got_ids = decode(core, kernel, lengths)
    assert kernel.steps == served + len(got) - 1  # every step after the prefill
    assert got_ids == want_ids
    for a, b in zip(got, want):
        assert (torch.log_softmax(a, -1) - torch.log_softmax(b, -1)).abs().max() < 5e-5


def test_an_avx2_build_matches_the_model_too(core, tmp_path):
    if " avx2 " not in cpu_flags():
        pytest.skip("no AVX2")
    lib = cbuild.build(cpu_layer.SOURCE, tmp_path, cbuild.FLAGS + ["-mno-avx512f"], also=(cpu_linear.SOURCE,))
    avx2 = cpu_layer.LayerKernel(lib, core.batcher._model)
    assert kernel(tmp_path, ["-mno-avx512f"]).isa == 256  # what the layer library linked
    assert_matches_the_model(core, avx2, [30, 77])


@torch.no_grad()
def test_passes_it_cannot_do_exactly_go_to_the_model(core):
    k, model = core.layer_kernel, core.batcher._model
    ids, mask, pos = torch.tensor([[5]]), torch.ones(1, 1, 1, 3, dtype=torch.bool), torch.tensor([[2]])
    slack = DynamicCache()
    slack.layers = [SlackLayer(torch.zeros(1, 3, 2, 64), torch.zeros(1, 3, 2, 64)) for _ in model.model.layers]
    assert k(model, torch.tensor([[5, 6]]), mask, pos, slack) is None  # a prefill
    assert k(model, ids, mask, pos, DynamicCache()) is None  # a cache of another kind
    q = model.model.layers[0].self_attn.q_proj
    hook = q.register_forward_hook(lambda m, a, out: out)  # as a mixed adapter pass adds LoRA
    try:
        assert k(model, ids, mask, pos, slack) is None
    finally:
        hook.remove()
    assert k(model, ids, mask, pos, slack).shape == (1, model.config.vocab_size)


def test_a_slack_layer_reserves_columns_for_the_kernel_to_write():
    layer = SlackLayer(torch.ones(2, 3, 4, 8), torch.ones(2, 3, 4, 8))
    cap = layer._k.shape[2]
    cols = [layer.reserve() for _ in range(cap - 4 + 1)]  # past the slack: the buffers grow
    assert cols == list(range(4, cap + 1)) and layer._k.shape[2] > cap
    assert layer.keys.shape == (2, 3, cap + 1, 8) and bool((layer.keys[:, :, :4] == 1).all())


def test_models_of_another_shape_keep_their_own_layers():
    tiny = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2)
    assert cpu_layer.llama_shaped(LlamaForCausalLM(LlamaConfig(**tiny))) is None
    assert "biases" in cpu_layer.llama_shaped(LlamaForCausalLM(LlamaConfig(**tiny, attention_bias=True)))
    assert "activation" in cpu_layer.llama_shaped(LlamaForCausalLM(LlamaConfig(**tiny, hidden_act="gelu")))
    assert "'mistral'" in cpu_layer.llama_shaped(MistralForCausalLM(MistralConfig(**tiny)))  # sliding windows


def test_the_layer_library_is_built_again_when_the_linear_kernel_it_links_changes(tmp_path):
    layer_c, linear_c = tmp_path / "cpu_layer.c", tmp_path / "cpu_linear.c"
    shutil.copy(cpu_layer.SOURCE, layer_c)
    shutil.copy(cpu_linear.SOURCE, linear_c)
    first = cbuild.build(layer_c, tmp_path / "cache", also=(linear_c,))
    assert cbuild.build(layer_c, tmp_path / "cache", also=(linear_c,)) == first
    linear_c.write_text(linear_c.read_text() + "\n/* changed */\n")
    second = cbuild.build(layer_c, tmp_path / "cache", also=(linear_c,))
    assert second != first and second.exists() and first.exists()


def test_weights_it_cannot_read_are_refused_at_load(core):
    lib = cbuild.build(cpu_layer.SOURCE, model_store.cache_dir() / "kernels", also=(cpu_linear.SOURCE,))
    q = core.batcher._model.model.layers[0].self_attn.q_proj
    w = q.weight
    q._parameters["weight"] = torch.nn.Parameter(w.detach().t().contiguous().t(), requires_grad=False)
    try:
        with pytest.raises(OSError, match="not contiguous fp32"):
            cpu_layer.LayerKernel(lib, core.batcher._model)
    finally:
        q._parameters["weight"] = w
