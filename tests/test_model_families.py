"""The model families people train (tests/tiny_families.py: tiny random-weight models of each
family's config, with a tokenizer and chat template of its family): the local engine serves each
(its C layer kernel where the layer is Llama's, transformers' layers where not, said in the log),
its stored log-probs match an independent forward, convert renders chat calls exactly as the
engine prompts, the trainer's LoRA wraps the family's attention and MLP projections, and the
adapter passes the check that mirrors vLLM's loader for that architecture (wharf/core/families.py)."""
from __future__ import annotations

import json

import pytest
import torch

from testing.app_thread import AppThread
from tests.tiny_families import FAMILIES, build, start_engine
from wharf.convert.sft import render_chat_call
from wharf.core.adapters import AdapterInvalid, check_adapter
from wharf.core.config import EngineConfig, load_config
from wharf.core.endpoint import Endpoint
from wharf.core.families import family_of
from wharf.core.model_store import ModelError, load_chat
from wharf.engine.server import Engine, make_app

LAYER_KERNEL = {"llama3", "mistral"}  # Llama's decoder layer exactly: the C layer kernel serves them
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}
AGENT_TURNS = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "List the files."},
               {"role": "assistant", "content": None, "tool_calls": [CALL]},
               {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"},
               {"role": "tool", "tool_call_id": "call_2", "content": "exit 0"}]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def served(request, tmp_path_factory):
    """(family name, model dir, Engine, URL, the engine's log lines) for one family."""
    torch.set_num_threads(2)
    name = request.param
    model_dir = build(name, tmp_path_factory.mktemp(name.replace(".", "")) / "model")
    engine, lines = start_engine(model_dir)
    with AppThread(lambda: make_app(engine), name=f"engine-{name}") as app:
        yield name, model_dir, engine, app.url, lines.lines


def chat(url: str, body: dict) -> dict:
    return Endpoint(url, model="m").chat({"logprobs": True, "return_token_ids": True, "temperature": 1.0,
                                           "top_p": 1.0, **body})


def test_the_engine_serves_it_and_says_on_which_layers(served):
    name, _, engine, url, lines = served
    r = chat(url, {"messages": AGENT_TURNS[:2], "max_tokens": 6, "min_tokens": 6, "seed": 3})
    assert len(r["choices"][0]["token_ids"]) == 6
    family = family_of(engine.core.adapters.base.config.model_type)
    said = "\n".join(lines)
    assert f"engine: {family.name} (model_type" in said
    if name == "gemma3":  # its sliding-window layers: the engine's full masks serve up to the window
        assert engine.core.max_model_len == 768 and "max_model_len lowered from 1024 to 768" in said
    if name in LAYER_KERNEL:
        assert engine.core.layer_kernel is not None and engine.core.layer_kernel.steps > 0
        assert "decode steps on the layer kernel" in said
    else:
        assert engine.core.layer_kernel is None
        assert "decode steps run transformers' own layers" in said


def test_stored_logprobs_match_an_independent_forward(served):
    _, model_dir, _, url, _ = served
    from transformers import AutoModelForCausalLM

    # (no min_tokens: it masks the eos, and the processed log-probs are then over the other tokens)
    r = chat(url, {"messages": AGENT_TURNS[:2], "max_tokens": 8, "seed": 7, "temperature": 0.7})
    prompt, ids = r["prompt_token_ids"], r["choices"][0]["token_ids"]
    stored = [e["logprob"] for e in r["choices"][0]["logprobs"]["content"]]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1] / 0.7
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(stored), ref, atol=2e-4), (stored, ref.tolist())


def test_convert_renders_a_chat_call_exactly_as_the_engine_prompts(served):
    name, model_dir, engine, url, _ = served
    request = {"model": "m", "messages": AGENT_TURNS, "tools": TOOLS}
    r = chat(url, {**request, "max_tokens": 2})
    answer = {"role": "assistant", "content": "Both files are listed."}
    response = {"choices": [{"index": 0, "message": answer, "finish_reason": "stop"}]}
    tok, style = load_chat(model_dir)
    prompt, completion = render_chat_call(tok, request, response, style)
    assert prompt == r["prompt_token_ids"]
    # the answer ends where the engine stops: the family's end-of-turn token, nothing after it
    assert completion[-1] in engine.core.batcher.eos_ids
    assert tok.decode(completion[:-1]).strip() == answer["content"]
    if name == "gemma3":  # no tool role in its template: the two results are one user turn
        text = tok.decode(prompt)
        assert text.count("<start_of_turn>user") == 2 and "exit 0" in text


def test_lora_wraps_the_familys_attention_and_mlp_projections(served, tmp_path):
    name, model_dir, engine, url, _ = served
    from wharf.train.model import load_policy, save_adapter

    cfg = load_config(None, [f"engine.model={model_dir}", "train.lora_rank=4", "train.lora_alpha=8"])
    model, _ = load_policy(cfg, None)
    fam = family_of(model.get_base_model().config.model_type)
    wrapped = [n for n, m in model.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A]
    layers = model.get_base_model().config.num_hidden_layers
    assert sorted({n.rsplit(".", 1)[-1] for n in wrapped}) == sorted(fam.targets)
    assert len(wrapped) == layers * len(fam.targets)  # every layer, nothing else
    out = tmp_path / "policy-v1"
    save_adapter(model, out)
    check_adapter("policy-v1", str(out), engine.core.adapters.base)  # what the engine and the trainer check
    status, text = Endpoint(url).request("POST", "/v1/load_lora_adapter",
                                         {"lora_name": "policy-v1", "lora_path": str(out)})
    assert status == 200, text
    assert chat(url, {"model": "policy-v1", "messages": AGENT_TURNS[:2], "max_tokens": 2})["model"] == "policy-v1"


def test_an_adapter_on_a_module_vllm_does_not_load_for_the_family_is_refused(served, tmp_path):
    name, model_dir, _, _, _ = served
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    fam = family_of(base.config.model_type)
    peft = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "lm_head"]))
    peft.save_pretrained(str(tmp_path / "a"))
    with pytest.raises(AdapterInvalid, match=rf"expected target modules in .* but received \['lm_head'\] \({fam.name}"):
        check_adapter("a", str(tmp_path / "a"), base)


def test_gemma_2_is_refused_in_one_line_saying_why(tmp_path):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from tests.tiny_families import TINY, build_tokenizer
    from wharf.train.model import load_policy

    tok = build_tokenizer(FAMILIES["gemma3"], tmp_path)  # Gemma's tokens and turns; Gemma 2's soft-capped head
    Gemma2ForCausalLM(Gemma2Config(**TINY, vocab_size=len(tok), head_dim=16)).save_pretrained(tmp_path)
    for start in (lambda: Engine(EngineConfig(model=str(tmp_path), device="cpu")),
                  lambda: load_policy(load_config(None, [f"engine.model={tmp_path}"]), None)):
        with pytest.raises(ModelError, match=r"cannot serve or train this model: Gemma 2 .*soft-caps") as e:
            start()
        assert "\n" not in str(e.value)


def test_a_model_transformers_cannot_load_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-family", "architectures": ["NoSuch"]}))
    with pytest.raises(ModelError, match=r"cannot serve or train this model: its config does not load") as e:
        Engine(EngineConfig(model=str(tmp_path), device="cpu"))
    assert "\n" not in str(e.value)
