"""Adapters served on merged weights (one adapter per batch) or per-row hooks (mixed batches):
log-probs against an independent float64 peft forward, and the base's weights never touched."""
from __future__ import annotations

import json
import shutil
import threading

import pytest
import torch

from wharf.core.config import EngineConfig
from wharf.core import model_store
from wharf.engine.sequence import Done, Failed, Sequence, Token
from wharf.engine.core import EngineCore
from wharf.core.adapters import AdapterInvalid
from wharf.engine.sampling import SamplingParams

pytestmark = pytest.mark.slow  # ~50 s of CPU: four model loads (one float64) and a few dozen passes
PROMPTS = ["Tell me about the moon.", "Write a haiku about compilers, please, in English.", "Hi"]
# fp32 against float64: the base itself is 2-4e-5 off on these sequences; a wrong scale or a
# missing layer is off by 1e-2 or more.
TOL = 5e-5


def save_adapter(base, path, seed, **lora):
    """A peft adapter with random (non-zero) A and B; `base` is given back unwrapped."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    peft = get_peft_model(base, LoraConfig(init_lora_weights=False, **lora))
    peft.save_pretrained(path)
    return peft.unload()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Two saved adapters: all seven projections (the trainer's targets), and two layers with rsLoRA."""
    d = tmp_path_factory.mktemp("adapters")
    base, _ = model_store.load_model(model_store.embedded_model_dir(), "cpu", "float32")
    base = save_adapter(base, d / "a1", 1, r=8, lora_alpha=16, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    save_adapter(base, d / "a2", 2, r=4, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "down_proj"])
    return {"a1": str(d / "a1"), "a2": str(d / "a2")}


@pytest.fixture(scope="module")
def reference(adapters):
    """float64 peft on a fresh base load: each adapter by name, the base with adapters disabled."""
    from peft import PeftModel

    base, _ = model_store.load_model(model_store.embedded_model_dir(), "cpu", "float32")
    peft = PeftModel.from_pretrained(base.double(), adapters["a1"], adapter_name="a1")
    peft.load_adapter(adapters["a2"], adapter_name="a2")
    peft.eval()

    def logprobs(adapter, prompt, out):
        with torch.no_grad():
            if adapter is None:
                with peft.disable_adapter():
                    logits = peft(torch.tensor([prompt + out])).logits[0]
            else:
                peft.set_adapter(adapter)
                logits = peft(torch.tensor([prompt + out])).logits[0]
        lp = torch.log_softmax(logits, -1)[len(prompt) - 1:-1]
        return lp.gather(1, torch.tensor(out)[:, None])[:, 0].tolist()
    return logprobs


@pytest.fixture(scope="module")
def core():
    c = EngineCore(EngineConfig(device="cpu", merged_loras=2))
    c.batcher.start()
    yield c
    c.batcher.stop()


def prompt_ids(core, i):
    return core.tok.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                        add_generation_prompt=True, tokenize=True, return_dict=False)


def generate(core, rows, max_tokens=8):
    """Submit one sequence per (adapter, seed) row at once; each row's (prompt, token ids, log-probs)."""
    events = [[] for _ in rows]
    left = threading.Semaphore(0)

    def emit(i, e):
        events[i].append(e)
        if isinstance(e, (Done, Failed)):
            left.release()
    seqs = [Sequence(prompt_ids(core, i), SamplingParams(max_tokens=max_tokens, seed=seed, ignore_eos=True),
                     emit=lambda e, i=i: emit(i, e), adapter=a) for i, (a, seed) in enumerate(rows)]
    core.batcher.submit(seqs)
    for _ in rows:
        assert left.acquire(timeout=120)
    for ev in events:
        assert isinstance(ev[-1], Done), ev[-1]
    return [(s.prompt_ids, [t.token_id for t in ev if isinstance(t, Token)],
             [t.logprob for t in ev if isinstance(t, Token)]) for s, ev in zip(seqs, events)]


def on_thread(core, fn):
    return core.batcher.call(fn).result(timeout=60)


def check(reference, rows, outs):
    for (adapter, _), (prompt, ids, lps) in zip(rows, outs):
        assert len(ids) == 8
        assert lps == pytest.approx(reference(adapter, prompt, ids), abs=TOL), adapter


def alike(outs, others):
    """The same prompts and tokens, log-probs within fp32's noise: a repeated prompt is served from
    the prefix cache, its last token computed in another pass than the first time (the weights
    themselves are compared bit for bit below)."""
    return all(p == q and i == j and a == pytest.approx(b, abs=1e-4) for (p, i, a), (q, j, b) in zip(outs, others))


def load_missing(core, adapters):
    for name, path in adapters.items():
        if name not in core.adapters.paths:
            on_thread(core, lambda: core.adapters.load(name, path, False))


def test_one_adapter_batches_run_merged_and_match_peft(core, adapters, reference):
    a = core.adapters
    load_missing(core, adapters)
    assert a.merged == ["a1", "a2"]  # merged at load time
    rows = [("a1", 0), ("a1", 1), ("a1", 2)]
    before = a.mixed_passes
    outs = generate(core, rows)
    assert a.mixed_passes == before and a.merged_passes > 0 and a.merged == ["a2", "a1"]
    check(reference, rows, outs)
    # A third adapter pushes out the least recently used merged set (engine.merged_loras=2) ...
    on_thread(core, lambda: a.load("a3", adapters["a1"], False))
    assert a.merged == ["a1", "a3"]
    # ... which is merged again when next served alone.
    rows = [("a2", 3), ("a2", 4)]
    check(reference, rows, generate(core, rows))
    assert a.merged == ["a3", "a2"]
    on_thread(core, lambda: a.unload("a3"))
    assert a.merged == ["a2"]


def test_mixed_batches_serve_each_row_its_own_weights(core, adapters, reference):
    a = core.adapters
    load_missing(core, adapters)
    rows = [(None, 0), ("a1", 1), ("a2", 2), ("a1", 3), (None, 4)]
    before = a.mixed_passes
    outs = generate(core, rows)
    assert a.mixed_passes > before
    check(reference, rows, outs)


def test_base_weights_untouched_by_loading_serving_replacing_unloading(core, adapters, reference):
    a = core.adapters
    weights = {n: (p, p.detach().clone()) for n, p in core.adapters.base.named_parameters()}
    base_rows = [(None, 7), (None, 8)]
    base_before = generate(core, base_rows)
    check(reference, base_rows, base_before)
    load_missing(core, adapters)
    generate(core, [("a1", 0)])
    generate(core, [("a2", 0), ("a1", 1), (None, 2)])
    # Replacing a1 in place with a2's weights drops a1's merged set.
    on_thread(core, lambda: a.load("a1", adapters["a2"], True))
    assert alike(generate(core, [("a1", 5)]), generate(core, [("a2", 5)]))
    assert alike(generate(core, base_rows), base_before)
    for name in list(a.paths):
        on_thread(core, lambda: a.unload(name))
    assert a.paths == {} and a.merged == []
    assert alike(generate(core, base_rows), base_before)
    model = core.adapters.base
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
    for n, p in model.named_parameters():
        assert p is weights[n][0] and torch.equal(p, weights[n][1]), n


def test_bad_adapters_refused_and_a_failed_replace_keeps_the_old(core, adapters, tmp_path):
    a = core.adapters
    on_thread(core, lambda: a.load("keep", adapters["a2"], False))
    want = generate(core, [("keep", 0)])
    bad = tmp_path / "alpha-pattern"
    shutil.copytree(adapters["a2"], bad)
    cfg = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**cfg, "alpha_pattern": {"q_proj": 4}}))
    with pytest.raises(AdapterInvalid, match="alpha_pattern is not supported"):
        on_thread(core, lambda: a.load("keep", str(bad), True))
    assert a.paths["keep"] == adapters["a2"]
    assert alike(generate(core, [("keep", 0)]), want)  # the old weights still serve
    on_thread(core, lambda: a.unload("keep"))
