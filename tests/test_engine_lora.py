"""Runtime LoRA adapters on the engine: vLLM's routes, codes and bodies; outputs really change."""
from __future__ import annotations

import concurrent.futures
import json
import shutil
import urllib.request

import pytest
import torch
from openai import OpenAI

from wharf.core import model_store
from test_engine_api import assert_error, post

MSGS = [{"role": "user", "content": "Tell me about the moon."}]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, engine_url):
    """A saved peft adapter with random (non-zero) A and B, and the peft model for reference passes."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base, tok = model_store.load_model(model_store.embedded_model_dir(), "cpu", "float32")
    peft_model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    path = tmp_path_factory.mktemp("adapters") / "policy-v1"
    peft_model.save_pretrained(path)
    return path, peft_model.eval()


def gen(client, model, seed=0, max_tokens=12):
    r = client.chat.completions.create(model=model, messages=MSGS, max_tokens=max_tokens, temperature=1.0, seed=seed,
                                       logprobs=True, extra_body={"return_token_ids": True})
    c = r.choices[0]
    assert r.model == model
    return r.model_extra["prompt_token_ids"], c.model_extra["token_ids"], [e.logprob for e in c.logprobs.content]


def same(a, b):
    """The same prompt and tokens, log-probs equal to fp32's noise (a prefix-cache hit computes the
    prompt's last token in another pass than a cold call does)."""
    return a[:2] == b[:2] and a[2] == pytest.approx(b[2], abs=1e-4)


def models(engine_url):
    with urllib.request.urlopen(f"{engine_url}/v1/models") as f:
        return [m["id"] for m in json.load(f)["data"]]


def test_adapter_load_changes_outputs_and_unload_restores_base(engine_url, adapter, tmp_path):
    path, peft_model = adapter
    client = OpenAI(base_url=f"{engine_url}/v1", api_key="EMPTY", max_retries=0)
    load, unload = f"{engine_url}/v1/load_lora_adapter", f"{engine_url}/v1/unload_lora_adapter"
    base_out = gen(client, "smollm2-135m")

    status, body = post(load, {"lora_name": "policy-v1", "lora_path": str(path)})
    assert (status, body) == (200, "Success: LoRA adapter 'policy-v1' added successfully.")
    assert "policy-v1" in models(engine_url)
    prompt, ids, lps = gen(client, "policy-v1")
    assert (ids, lps) != base_out[1:], "the adapter did not change the output"
    with torch.no_grad():
        logits = peft_model(torch.tensor([prompt + ids])).logits[0]
    want = torch.log_softmax(logits, -1)[len(prompt) - 1:-1].gather(1, torch.tensor(ids)[:, None])[:, 0]
    assert lps == pytest.approx(want.tolist(), abs=1e-4)
    assert same(gen(client, "smollm2-135m"), base_out)  # the base name still serves the base model

    # Base and adapter requests in flight together are each served by their own weights.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(gen, client, m) for m in ("policy-v1", "smollm2-135m", "policy-v1", "smollm2-135m")]
        outs = [f.result() for f in futs]
    for m, o in zip(("policy-v1", "smollm2-135m") * 2, outs):
        ref = (prompt, ids, lps) if m == "policy-v1" else base_out
        assert o[1] == ref[1] and o[2] == pytest.approx(ref[2], abs=1e-4)

    # A second adapter at the same time; duplicate names need load_inplace.
    assert post(load, {"lora_name": "policy-v2", "lora_path": str(path)})[0] == 200
    assert_error(*post(load, {"lora_name": "policy-v1", "lora_path": str(path)}), 400, "InvalidUserInput",
                 "has already been loaded")
    assert post(load, {"lora_name": "policy-v1", "lora_path": str(path), "load_inplace": True})[0] == 200
    assert gen(client, "policy-v2")[1] == ids

    assert post(unload, {"lora_name": "policy-v2"}) == (200, "Success: LoRA adapter 'policy-v2' removed successfully.")
    assert post(unload, {"lora_name": "policy-v1"})[0] == 200
    assert models(engine_url) == ["smollm2-135m"]
    assert same(gen(client, "smollm2-135m"), base_out)
    status, body = post(f"{engine_url}/v1/chat/completions", {"model": "policy-v1", "messages": MSGS})
    assert_error(status, body, 404, "NotFoundError", "does not exist")
    assert_error(*post(unload, {"lora_name": "policy-v1"}), 404, "NotFoundError", "cannot be found")


def test_missing_and_bad_adapters_get_vllm_codes(engine_url, adapter, tmp_path):
    path, _ = adapter
    load = f"{engine_url}/v1/load_lora_adapter"
    missing = tmp_path / "nowhere"
    assert_error(*post(load, {"lora_name": "x", "lora_path": str(missing)}), 404, "NotFoundError",
                 f"Loading lora x failed: No adapter found for {missing}")
    assert_error(*post(load, {"lora_name": "x"}), 400, "InvalidUserInput", "Both 'lora_name' and 'lora_path'")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text("{not json")
    assert_error(*post(load, {"lora_name": "bad", "lora_path": str(bad)}), 500, "InternalServerError", "not valid JSON")
    # Rank in the config that does not match the tensors.
    wrong = tmp_path / "wrong-rank"
    shutil.copytree(path, wrong)
    cfg = json.loads((wrong / "adapter_config.json").read_text())
    (wrong / "adapter_config.json").write_text(json.dumps({**cfg, "r": 4}))
    assert_error(*post(load, {"lora_name": "wrong", "lora_path": str(wrong)}), 500, "InternalServerError", "shape")
    (wrong / "adapter_model.safetensors").write_bytes(b"garbage")
    (wrong / "adapter_config.json").write_text(json.dumps(cfg))
    assert_error(*post(load, {"lora_name": "wrong", "lora_path": str(wrong)}), 500, "InternalServerError",
                 "cannot read")
    assert models(engine_url) == ["smollm2-135m"]  # nothing half-loaded
    status, body = post(f"{engine_url}/v1/chat/completions", {"messages": MSGS, "max_tokens": 2})
    assert status == 200
