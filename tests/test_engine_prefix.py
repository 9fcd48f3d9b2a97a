"""Prefix caching: the cache's rules on their own, then the live engine reusing a prompt's KV
(another attempt, the next call of a conversation) with log-probs still exact, base and adapter,
and never across adapters or reloads."""
from __future__ import annotations

import re
import urllib.request

import pytest
import torch
from openai import OpenAI

from wharf.engine.kv import PrefillRow, is_slack, prefill_batch, row_kv, slack_cache
from wharf.engine.prefix_cache import PrefixCache, common_prefix
from wharf.core import model_store
from test_engine_api import post

KV_TOKEN = 2 * 3 * 8 * 4  # bytes a token in the toy KV below: [layers=1, 2, heads=3, n, dim=8] fp32


def kv(n: int, fill: float = 0.0) -> torch.Tensor:
    return torch.full((1, 2, 3, n, 8), fill)


def ids(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.long)


def test_longest_common_prefix_per_key_and_the_last_prompt_token_is_always_computed():
    c = PrefixCache(1 << 20, min_hit=2)
    c.store(None, ids(1, 2, 3, 4), kv(4, 1.0))
    c.store(("a", 1), ids(1, 2, 3, 4, 5, 6), kv(6, 2.0))
    n, e = c.match(None, ids(1, 2, 3, 9, 9))
    assert n == 3 and float(e.kv[0, 0, 0, 0, 0]) == 1.0
    assert c.match(None, ids(1, 2, 3, 4))[0] == 3  # a whole stored prompt: its last token is computed again
    assert c.match(("a", 1), ids(1, 2, 3, 4, 5, 6, 7))[0] == 6
    assert c.match(("a", 2), ids(1, 2, 3, 4, 5, 6, 7)) == (0, None)  # a reloaded adapter: another key
    assert c.match(None, ids(7, 1, 2)) == (0, None) and c.match(None, ids(1, 9)) == (0, None)  # < min_hit
    assert common_prefix(ids(1, 2), ids(1, 2, 3)) == 2 and common_prefix(ids(5), ids(6)) == 0


def test_store_replaces_what_it_extends_and_evicts_least_recently_used_within_budget():
    c = PrefixCache(10 * (KV_TOKEN + 8), min_hit=1)  # room for 10 tokens
    c.store(None, ids(1, 2, 3), kv(3))
    c.store(None, ids(1, 2, 3, 4), kv(4))  # extends the first: replaces it
    c.store(None, ids(1, 2), kv(2))  # covered by the stored one: nothing added
    c.store(None, ids(1, 2, 3), lambda: pytest.fail("a covered prefix's KV was copied out"))
    assert len(c) == 1 and c.bytes == 4 * (KV_TOKEN + 8)
    c.store(None, ids(5, 6, 7), kv(3))
    c.match(None, ids(1, 2, 3, 4, 0))  # used: now the most recent
    c.store(None, ids(8, 9, 10, 11), kv(4))  # 11 tokens: the least recently used (5, 6, 7) goes
    assert len(c) == 2 and c.evictions == 1 and c.match(None, ids(5, 6, 7, 0)) == (0, None)
    c.store(None, ids(*range(20, 40)), kv(20))  # larger than the whole budget: not kept
    assert len(c) == 2 and c.bytes <= c.budget
    c.store(("a", 1), ids(1, 2, 3), kv(3))
    c.forget(lambda key: key is not None and key[0] == "a")
    assert c.match(("a", 1), ids(1, 2, 3, 4)) == (0, None) and len(c) == 1 + (c.bytes > 4 * (KV_TOKEN + 8))


def test_row_kv_copies_a_rows_real_columns_whether_or_not_they_are_one_run():
    keys = torch.arange(2 * 3 * 6 * 4, dtype=torch.float32).view(2, 3, 6, 4)  # [B, H, L, D]
    cache = slack_cache([(keys, -keys), (2 * keys, -2 * keys)], room=3)
    assert is_slack(cache) and cache.layers[0].keys.shape == (2, 3, 6, 4)
    for cols in ([False, False, True, True, True, True], [False, True, True, False, True, True], [True] * 6):
        c = torch.tensor(cols)
        out = row_kv(cache.layers, 1, c)
        assert out.shape == (2, 2, 3, sum(cols), 4)
        assert torch.equal(out[0, 0], keys[1][:, c]) and torch.equal(out[1, 1], -2 * keys[1][:, c])


def test_prefill_batch_puts_each_row_at_its_own_positions():
    b = prefill_batch([PrefillRow([10, 11, 12, 13, 14], 3, kv(4, 1.0)), PrefillRow([20, 21], 0, None)], pad_id=0)
    assert b.ids.tolist() == [[13, 14], [20, 21]]
    assert b.mask.tolist() == [[True] * 5, [False] * 3 + [True] * 2]
    assert b.position_ids.tolist() == [[3, 4], [0, 1]]
    # The second computed token of row 0 sees the stored prefix and both computed tokens.
    assert b.mask4d[0, 0, 1].tolist() == [True] * 5 and b.mask4d[1, 0, 0].tolist() == [False] * 3 + [True, False]
    assert b.past[0][0].shape == (2, 3, 3, 8) and float(b.past[0][0][1].abs().sum()) == 0.0
    b = prefill_batch([PrefillRow([7, 8, 9], 2, kv(2)), PrefillRow([7, 8, 9, 5, 6], 2, kv(2))], pad_id=0)
    assert b.ids.tolist() == [[0, 0, 9], [9, 5, 6]] and b.position_ids[1].tolist() == [2, 3, 4]


# -- the live engine -------------------------------------------------------------------------------
SYSTEM = ("Prefix test. You are a careful coding agent working in a small Python repository. Read the task, run one "
          "shell command at a time, look at its output, and finish with a short summary. ") * 4


def cache_counts(engine_url) -> tuple[int, int]:
    with urllib.request.urlopen(f"{engine_url}/metrics") as f:
        text = f.read().decode()
    assert "# TYPE vllm:prefix_cache_hits_total counter" in text
    q, h = (int(re.search(rf"^vllm:prefix_cache_{k}_total{{.*}} (\d+)$", text, re.M).group(1))
            for k in ("queries", "hits"))
    return q, h


@pytest.fixture(scope="module")
def peft_model(tmp_path_factory):
    """A random adapter on q and v, saved, and the peft model (adapter off: the base) for reference passes."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(3)
    base, _ = model_store.load_model(model_store.embedded_model_dir(), "cpu", "float32")
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False)).eval()
    path = tmp_path_factory.mktemp("prefix") / "adapter"
    model.save_pretrained(path)
    return model, path


def call(client, engine_url, model, messages, seed):
    """One chat call: its prompt ids, ids, log-probs, and the prompt tokens the cache gave it."""
    before = cache_counts(engine_url)
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=1.0, seed=seed,
                                       logprobs=True, extra_body={"return_token_ids": True})
    after = cache_counts(engine_url)
    assert after[0] - before[0] == len(r.model_extra["prompt_token_ids"])
    c = r.choices[0]
    return (r.model_extra["prompt_token_ids"], c.model_extra["token_ids"], [e.logprob for e in c.logprobs.content],
            after[1] - before[1], c.message.content)


def assert_exact(peft_model, adapter: bool, prompt, out, lps):
    """The engine's log-probs against a fresh fp32 forward of the whole sequence (the trainer's):
    within 1e-5 on average over the answer, as cold calls are."""
    with torch.no_grad():
        if adapter:
            logits = peft_model(torch.tensor([prompt + out])).logits[0]
        else:
            with peft_model.disable_adapter():
                logits = peft_model(torch.tensor([prompt + out])).logits[0]
    want = torch.log_softmax(logits, -1)[len(prompt) - 1:-1].gather(1, torch.tensor(out)[:, None])[:, 0]
    err = [abs(a - b) for a, b in zip(lps, want.tolist())]
    # fp32 against fp32 in another order: a cold call is already ~1e-5 off at its worst token.
    assert sum(err) / len(err) < 1e-5 and max(err) < 5e-5, err


def test_attempts_and_follow_ups_reuse_the_prefix_exactly_per_adapter(engine_url, peft_model):
    model, path = peft_model
    client = OpenAI(base_url=f"{engine_url}/v1", api_key="EMPTY", max_retries=0, timeout=120)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "List the files, then stop."}]
    for name, adapter in (("smollm2-135m", False), ("prefix-a", True), ("prefix-b", True)):
        if adapter:  # the same weights under a second name share nothing with the first
            assert post(f"{engine_url}/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})[0] == 200
        first = call(client, engine_url, name, msgs, seed=1)
        assert first[3] == 0, f"{name}: reused a prefix computed under other weights"
        again = call(client, engine_url, name, msgs, seed=1)  # another attempt of the same task
        assert again[3] == len(first[0]) - 1
        assert again[1] == first[1], "the same seed drew other tokens after a prefix hit"
        follow = msgs + [{"role": "assistant", "content": first[4]}, {"role": "user", "content": "Now say done."}]
        third = call(client, engine_url, name, follow, seed=3)  # the rollout's next call
        assert third[3] >= len(first[0])
        for prompt, out, lps, *_ in (first, again, third):
            assert_exact(model, adapter, prompt, out, lps)
    for name in ("prefix-a", "prefix-b"):
        assert post(f"{engine_url}/v1/unload_lora_adapter", {"lora_name": name})[0] == 200
