"""Request fields -> SamplingParams, checked the way vLLM checks them (400 with the field named)."""
from __future__ import annotations

from typing import Any

from .errors import bad_request
from .sampling import SamplingParams

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


def _num(body: dict, key: str, kind: type, default: Any, lo: float | None = None, hi: float | None = None):
    v = body.get(key)
    if v is None:
        return default
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or isinstance(v, int))
    if not ok:
        raise bad_request(f"'{key}' must be {'a number' if kind is float else 'an integer'}, got {v!r}", key)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise bad_request(f"'{key}' must be in [{lo}, {hi}], got {v}", key)
    return kind(v)


def _bool(body: dict, key: str, default: bool = False) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_request(f"'{key}' must be true or false, got {v!r}", key)
    return v


def check_prompt_len(n_prompt: int, max_model_len: int) -> None:
    if n_prompt >= max_model_len:
        raise bad_request(f"This model's maximum context length is {max_model_len} tokens. However, your "
                          f"request has {n_prompt} input tokens. Please reduce the length of the input messages.")


def sampling_params(body: dict, n_prompt: int, max_model_len: int, *, chat: bool,
                    default_temperature: float = 1.0, default_top_p: float = 1.0) -> SamplingParams:
    check_prompt_len(n_prompt, max_model_len)
    room = max_model_len - n_prompt
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _num(body, key, int, room, lo=1)
    if max_tokens > room:
        raise bad_request(f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                          f"maximum context length is {max_model_len} tokens and your request has {n_prompt} "
                          f"input tokens ({max_tokens} > {max_model_len} - {n_prompt}).", key)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request(f"'stop' must be a string or a list of strings, got {body.get('stop')!r}", "stop")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) for t in stop_ids):
        raise bad_request("'stop_token_ids' must be a list of integers", "stop_token_ids")
    if chat:
        top = _num(body, "top_logprobs", int, 0, lo=0, hi=MAX_LOGPROBS)
        if top and not body.get("logprobs"):
            raise bad_request("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
    else:  # the legacy completions API: logprobs is the number of alternatives
        top = _num(body, "logprobs", int, 0, lo=0, hi=MAX_LOGPROBS)
    return SamplingParams(
        temperature=_num(body, "temperature", float, default_temperature, lo=0.0, hi=2.0),
        top_p=_num(body, "top_p", float, default_top_p, lo=1e-9, hi=1.0),
        max_tokens=max_tokens,
        seed=_num(body, "seed", int, None),
        stop=tuple(stop),
        stop_token_ids=tuple(stop_ids),
        ignore_eos=_bool(body, "ignore_eos"),
        min_tokens=_num(body, "min_tokens", int, 0, lo=0),
        top_logprobs=top,
    )


def n_choices(body: dict) -> int:
    return _num(body, "n", int, 1, lo=1, hi=64)


def flag(body: dict, key: str, default: bool = False) -> bool:
    return _bool(body, key, default)


def usage(n_prompt: int, n_completion: int) -> dict:
    """An answer's usage block, as vLLM fills it."""
    return {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n_completion,
            "completion_tokens": n_completion, "prompt_tokens_details": None}
