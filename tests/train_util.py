"""Small real rounds for the train tests: completions sampled from the base model itself, written
as convert's micro-batches (wharf.batches), so the stored log-probs are exactly on-policy."""
from __future__ import annotations

from pathlib import Path

import torch

from wharf.core.config import RunConfig, load_config
from wharf.core.model_store import embedded_model_dir, load_model
from wharf.core.layout import RunLayout
from wharf.core.batches import BatchFile, BatchIndex, MicroBatch, PAD_ID, save_micro_batch, write_index

PROMPTS = ["Write the word yes.", "Count from one to three.", "Name a colour.", "Say hello to Ada.",
           "What is 2 + 2?", "Name an animal.", "Spell cat.", "Give one fruit."]

_MODEL = {}


def base():
    if not _MODEL:
        _MODEL["m"] = load_model(embedded_model_dir(), "cpu", "float32")
    return _MODEL["m"]


_ROWS: dict = {}


def sample_rows(n_rows: int, new_tokens: int, temperature: float, seed: int) -> list[dict]:
    """Chat-templated prompts, completions sampled at `temperature`, their processed log-probs
    (cached for the session: several test modules use the same rows)."""
    key = (n_rows, new_tokens, temperature, seed)
    if key not in _ROWS:
        _ROWS[key] = _sample_rows(*key)
    return _ROWS[key]


def _sample_rows(n_rows: int, new_tokens: int, temperature: float, seed: int) -> list[dict]:
    model, tok = base()
    torch.manual_seed(seed)
    rows = []
    for i in range(n_rows):
        msgs = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]
        prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
        if isinstance(prompt, dict):
            prompt = prompt["input_ids"]
        ids = torch.tensor([list(prompt)])
        with torch.no_grad():
            out = model.generate(ids, do_sample=True, temperature=temperature, top_p=1.0, top_k=0,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=tok.eos_token_id)
            logits = model(out).logits[0, :-1].float() / temperature
        lp = torch.log_softmax(logits, -1).gather(-1, out[0, 1:, None]).squeeze(-1)
        n_p = ids.shape[1]
        rows.append({"ids": out[0].tolist(), "n_prompt": n_p, "lp": [0.0] * n_p + lp[n_p - 1:].tolist()})
    return rows


def write_round(convert_dir: Path, rows: list[dict], advantages: list[float], temperature: float,
                rows_per_file: int = 2) -> BatchIndex:
    convert_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for f, start in enumerate(range(0, len(rows), rows_per_file)):
        chunk = rows[start:start + rows_per_file]
        T = max(len(r["ids"]) for r in chunk)
        mb = _micro_batch(chunk, advantages[start:start + rows_per_file], start, temperature, T)
        name = f"mb-{f:04d}.safetensors"
        save_micro_batch(mb, convert_dir / name)
        files.append(BatchFile(file=name, rows=len(chunk), seq_len=T, tokens=int(mb.attention_mask.sum()),
                               loss_tokens=int(mb.completion_mask.sum()), rollouts=float(len(chunk))))
    index = BatchIndex(files=files, rollouts=[{"rollout_id": f"r{i}"} for i in range(len(rows))], groups=["g0"])
    write_index(index, convert_dir / "index.json")
    return index


def _micro_batch(rows, advs, start, temperature, T) -> MicroBatch:
    B = len(rows)
    t = {k: torch.zeros(B, T, dtype=torch.int64) for k in ("input_ids", "attention_mask", "position_ids")}
    t["input_ids"].fill_(PAD_ID)
    cm, old = torch.zeros(B, T), torch.zeros(B, T)
    for b, r in enumerate(rows):
        n = len(r["ids"])
        t["input_ids"][b, :n] = torch.tensor(r["ids"])
        t["attention_mask"][b, :n] = 1
        t["position_ids"][b, :n] = torch.arange(n)
        cm[b, r["n_prompt"]:n] = 1
        old[b, :n] = torch.tensor(r["lp"]) * cm[b, :n]
    return MicroBatch(**t, completion_mask=cm, old_logprobs=old, advantages=torch.tensor(advs, dtype=torch.float32),
                      weights=torch.ones(B), temperatures=torch.full((B,), float(temperature)),
                      rollout_index=torch.arange(start, start + B), group_index=torch.zeros(B, dtype=torch.int64))


def run_config(tmp: Path, *overrides: str) -> RunConfig:
    base_over = ["name=t", f"runs_dir={tmp}", "train.lora_rank=4", "train.lora_alpha=8", "train.rows_per_step=4",
                 "train.publish=false", "train.device=cpu", "endpoint.url=http://127.0.0.1:9599"]
    return load_config(None, [*base_over, *overrides])


def convert_path(cfg: RunConfig, k: int = 0) -> Path:
    return RunLayout.of(cfg.runs_dir, cfg.name).round(k).convert.root


def trained_adapter(tmp: Path, name: str = "sft") -> Path:
    """A LoRA trained by one small round (run `name` in tmp, policy-v1 of `<tmp>/<name>`): a
    stand-in for any adapter a run starts from (an SFT run's, as `make mini-sft` trains one)."""
    from wharf.train.stage import train_round

    cfg = run_config(tmp, f"name={name}", "train.lr=0.02")
    write_round(convert_path(cfg), sample_rows(4, 10, 1.0, seed=0), [1.0, 1.0, 1.0, 1.0], 1.0)
    return Path(train_round(cfg, progress=False).adapter)


def adapter_tensors(adapter: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(adapter / "adapter_model.safetensors"))
