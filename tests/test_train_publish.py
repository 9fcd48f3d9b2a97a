"""The trained adapter reaches a real local engine as policy-v1 and changes what it serves."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from wharf.core.config import dump_config
from wharf.core.endpoint import Endpoint
from wharf.train import publish as publish_mod
from wharf.train.publish import PublishError
from wharf.train.stage import train_round

sys.path.insert(0, str(Path(__file__).parent))
from train_util import convert_path, run_config, sample_rows, write_round  # noqa: E402

pytestmark = pytest.mark.slow


def logprobs(ep: Endpoint, model: str) -> list[float]:
    r = ep._json("POST", "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 6,
        "temperature": 0, "logprobs": True, "seed": 0})
    return [e["logprob"] for e in r["choices"][0]["logprobs"]["content"]]


def test_train_publishes_policy_v1_to_the_engine(tmp_path, engine_url, capsys):
    cfg = run_config(tmp_path, "train.lr=0.01", "train.publish=true", f"endpoint.url={engine_url}")
    write_round(convert_path(cfg), sample_rows(4, 10, 1.0, seed=0), [1.0, -1.0, 1.0, -1.0], 1.0)
    result = train_round(cfg, progress=False)
    assert result.published, result.publish_message
    ep = Endpoint(engine_url)
    assert result.policy == cfg.policy(1) and cfg.policy(1) in ep.models()
    base, tuned = logprobs(ep, cfg.endpoint.model), logprobs(ep, cfg.policy(1))
    assert max(abs(a - b) for a, b in zip(base, tuned)) > 1e-3, (base, tuned)
    # `make publish` again: a name is never reloaded in place; the adapter stays on disk.
    config = tmp_path / "run.yaml"
    dump_config(cfg, config)
    assert publish_mod.main(["--config", str(config)]) == 1
    assert f"already serves '{cfg.policy(1)}'" in capsys.readouterr().err
    assert Path(result.adapter, "adapter_model.safetensors").is_file()
    with pytest.raises(PublishError, match="no adapter to publish"):
        publish_mod.publish(cfg, tmp_path / "missing", "policy-v9")
    ep.unload_adapter(cfg.policy(1))  # the engine is shared by the session's other tests


@pytest.mark.gpu
def test_train_publishes_policy_v1_to_vllm(tmp_path):
    import importlib.util

    import torch

    if not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None:
        pytest.skip("needs CUDA and vllm")
    from wharf.engine.launch import launch
    from wharf.core.endpoint import with_key
    from wharf.core.model_store import embedded_model_dir

    model = str(embedded_model_dir())  # vLLM serves the same converted base the trainer loads
    cfg = run_config(tmp_path, "train.lr=0.01", "train.publish=true", "train.device=cuda",
                     "endpoint.kind=vllm", "endpoint.url=http://127.0.0.1:9530", f"endpoint.model={model}",
                     "endpoint.vllm_args=[--enable-lora,--max-lora-rank=64,--max-loras=4,"
                     "--logprobs-mode=processed_logprobs,--max-model-len=2048,--gpu-memory-utilization=0.3]")
    write_round(convert_path(cfg), sample_rows(4, 10, 1.0, seed=0), [1.0, -1.0, 1.0, -1.0], 1.0)
    with launch(cfg, log_dir=tmp_path) as ep:
        result = train_round(with_key(cfg, ep), progress=False)  # publish sends the key vLLM was given
        assert result.published, result.publish_message
        assert cfg.policy(1) in ep.models()
        base, tuned = logprobs(ep, model), logprobs(ep, cfg.policy(1))
        assert max(abs(a - b) for a, b in zip(base, tuned)) > 1e-3, (base, tuned)
