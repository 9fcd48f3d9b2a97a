"""Client for the OpenAI-compatible endpoint (our local engine or vLLM).

Everything the project asks of an endpoint besides chat itself: wait until it is healthy, check
that it returns token ids and *processed* log-probs (the behaviour policy), list models, and
load/unload LoRA adapters between rounds. Starting one when nothing answers is engine.launch's
(it names the engine's program, which this floor must not). Plain urllib: these are a handful of
control calls, not the data path.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .config import RunConfig
from .errors import WharfError

class EndpointError(WharfError, RuntimeError):
    """The endpoint is missing, unhealthy or misconfigured; the message says what to do."""


class Endpoint:
    def __init__(self, url: str, api_key: str | None = None, model: str | None = None, timeout: float = 120.0):
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.model = model
        self.timeout = timeout
        self.process: subprocess.Popen | None = None  # set by launch() when it started the endpoint

    # -- HTTP -------------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> tuple[int, str]:
        """(status, text) for any status; raises EndpointError only when nothing answers."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except (urllib.error.URLError, OSError) as e:
            raise EndpointError(f"{self.url}{path}: no answer ({getattr(e, 'reason', e)})") from None

    def _json(self, method: str, path: str, body: Any = None) -> Any:
        status, text = self.request(method, path, body)
        if status != 200:
            raise EndpointError(f"{method} {self.url}{path} -> {status}: {_error_message(text)}{_auth_hint(status)}")
        return json.loads(text)

    def prefix_cache_counters(self) -> tuple[float, float] | None:
        """(prompt tokens looked up, tokens of them reused) from /metrics as the local engine and
        vLLM count them; None where /metrics is missing or lacks the counters (cache off)."""
        try:
            status, text = self.request("GET", "/metrics", timeout=10)
        except EndpointError:
            return None
        return parse_prefix_counters(text) if status == 200 else None

    # -- health -----------------------------------------------------------------------------------
    def healthy(self) -> bool:
        try:
            return self.request("GET", "/health", timeout=3)[0] == 200
        except EndpointError:
            return False

    def wait_healthy(self, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise EndpointError(f"the endpoint process exited with code {proc.returncode} before "
                                    f"{self.url}/health answered{_log_tail(log)}")
            if self.healthy():
                return
            time.sleep(0.5)
        raise EndpointError(f"{self.url}/health did not answer within {timeout:.0f} s; is the endpoint up? "
                            f"(raise endpoint.startup_timeout_s if it is still loading){_log_tail(log)}")

    # -- models and adapters ------------------------------------------------------------------------
    def models(self) -> list[str]:
        return list(self.roots())

    def roots(self) -> dict[str, str | None]:
        """{served name: the path it was loaded from} (vLLM's `root`; a LoRA's is its adapter dir):
        what tells one run's policy-v<k> from another's of the same name."""
        return {m["id"]: m.get("root") for m in self._json("GET", "/v1/models")["data"]}

    def load_adapter(self, name: str, path: str | Path, inplace: bool = False) -> str:
        status, text = self.request("POST", "/v1/load_lora_adapter", {
            "lora_name": name, "lora_path": str(Path(path).resolve()), "load_inplace": inplace})
        if status != 200:
            hint = (" (vLLM needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 and --enable-lora)"
                    if status in (404, 405) and "No adapter found" not in text else "")
            raise EndpointError(f"loading adapter {name!r} from {path} -> {status}: {_error_message(text)}{hint}"
                                f"{_auth_hint(status)}")
        return text

    def unload_adapter(self, name: str) -> str:
        status, text = self.request("POST", "/v1/unload_lora_adapter", {"lora_name": name})
        if status != 200:
            raise EndpointError(f"unloading adapter {name!r} -> {status}: {_error_message(text)}")
        return text

    # -- the start-up check -------------------------------------------------------------------------
    def chat(self, body: dict) -> dict:
        return self._json("POST", "/v1/chat/completions", {"model": self.model, **body})

    def check_capture(self) -> None:
        """Stop unless the endpoint returns token ids and processed (temperature-scaled) log-probs.

        The top log-probs at one position do not depend on what was sampled: with processed
        log-probs, their gaps at temperature 0.5 are twice those at temperature 1; raw log-probs
        (vLLM's default) give the same gaps at both.
        """
        base = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 1,
                "logprobs": True, "top_logprobs": 5, "return_token_ids": True, "top_p": 1.0, "seed": 0}
        gaps = []
        for t in (1.0, 0.5):
            r = self.chat({**base, "temperature": t})
            if "prompt_token_ids" not in r or not r.get("prompt_token_ids"):
                raise EndpointError(f"{self.url} returned no prompt_token_ids for return_token_ids=true: "
                                    "use vLLM >= 0.10.2 (or the local engine)")
            ch = r["choices"][0]
            entries = (ch.get("logprobs") or {}).get("content") or []
            if not ch.get("token_ids") or len(entries) != len(ch["token_ids"]):
                raise EndpointError(f"{self.url} returned no choices[0].token_ids or no log-prob per token: "
                                    "use vLLM >= 0.10.2 (or the local engine) and do not send include_reasoning=false")
            top = sorted((e["logprob"] for e in entries[0]["top_logprobs"]), reverse=True)
            if len(top) < 2:
                raise EndpointError(f"{self.url} returned fewer than 2 top_logprobs; cannot check the logprobs mode")
            gaps.append(top[0] - top[-1])
        if gaps[0] > 1e-3 and abs(gaps[1] / gaps[0] - 2.0) > 0.05:
            raise EndpointError(
                f"{self.url} returns raw log-probs (their spread does not change with the temperature), so the "
                "stored log-probs would not be the sampling policy's: start vLLM with "
                "--logprobs-mode processed_logprobs")


def _error_message(text: str) -> str:
    try:
        return json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return text.strip()[:500]


def _auth_hint(status: int) -> str:
    return " (the endpoint wants an API key: set endpoint.api_key to its key)" if status == 401 else ""


PREFIX_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


def parse_prefix_counters(text: str) -> tuple[float, float] | None:
    """The two prefix-cache counters of a Prometheus text page, summed over their labels (vLLM
    labels one sample per engine); None unless both are there."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition("{") if "{" in line else line.partition(" ")
        if name in PREFIX_COUNTERS:
            value = rest.rpartition("}")[2] if "}" in rest else rest
            sums[name] = sums.get(name, 0.0) + float(value.split()[0])
    return (sums[PREFIX_COUNTERS[0]], sums[PREFIX_COUNTERS[1]]) if len(sums) == 2 else None


def _log_tail(log: Path | None) -> str:
    if log is None or not log.is_file():
        return ""
    tail = log.read_text(errors="replace")[-2000:]
    return f"; its log ({log}) ends with:\n{tail}"


def with_key(cfg: RunConfig, ep: "Endpoint") -> RunConfig:
    """`cfg` with endpoint.api_key as `ep` (from launch) uses it, for the proxy and publish."""
    return dataclasses.replace(cfg, endpoint=dataclasses.replace(cfg.endpoint, api_key=ep.api_key))
