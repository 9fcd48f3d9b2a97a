"""The upstream side of a recorded call: the request with the recording parameters forced, the POST
to the rollout's endpoint (failing over while nothing was sent), and the answer read or refused.

Every way the endpoint can fail ends as an `UpstreamFailure` (status for the agent, a kind for
the metrics); the recording path turns it into an error row.
"""
from __future__ import annotations

import asyncio
import re

import aiohttp

from wharf.core.config import RunConfig
from wharf.collect.proxy import jsonx
from wharf.collect.proxy.dialects import NOTES
from wharf.collect.proxy.errors import JSON, UpstreamFailure
from wharf.collect.proxy.rollouts import Rollout
from wharf.collect.proxy.upstreams import UpstreamPool

# Sampling knobs an agent may send whose effect the endpoint's log-probs would include while the
# trainer, which scores softmax(logits / temperature), cannot reproduce it: never sent upstream,
# listed with their values in the row's sampling.wharf_notes.dropped_sampling.
UNREPRODUCIBLE = ("top_k", "min_p", "typical_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                  "logit_bias", "min_tokens", "bad_words", "allowed_token_ids", "best_of", "use_beam_search",
                  "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")
# vLLM fills each of these that a request leaves unset from the model's generation_config.json
# (Qwen2.5's: top_k 20, repetition_penalty 1.05-1.1), which would sample from, and report processed
# log-probs of, a distribution the trainer never scores: sent upstream at their neutral values.
NEUTRAL_SAMPLING = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                    "frequency_penalty": 0.0}
# Tokens a chat template adds around the messages' JSON bytes (which bound their own tokens).
_TEMPLATE_SLACK = 512
_UNKNOWN = -1  # an upstream whose /tokenize reports no max_model_len


def forced_request(req: dict, rollout: Rollout, turn: int, max_tokens: int | None,
                   full: bool = False, room: int | None = None, text_only: bool = False) -> tuple[bytes, dict]:
    """The body sent upstream, and what the row keeps as `sampling` (the whole body when `full`:
    a translated call's chat messages exist nowhere else). `room`: the tokens the context leaves
    after the prompt, a cap on max_tokens (an agent asking 64k of a 32k model still gets an answer).
    A dialect's notes (what its translation left out) go into `sampling`, never upstream.
    `text_only` (proxy.text_only: a teacher, no token ids): none of vLLM's own parameters are sent,
    an API model would refuse them; its answers train only as SFT rows."""
    up = dict(req)
    notes = up.pop(NOTES, None)
    dropped = {k: up.pop(k) for k in UNREPRODUCIBLE if k in up}
    if dropped:
        notes = {**(notes or {}), "dropped_sampling": dropped}
    if not text_only:
        up.update(NEUTRAL_SAMPLING)
    up["model"] = rollout.policy
    up["temperature"] = rollout.temperature
    up["top_p"] = rollout.top_p
    if rollout.seed is not None:
        up["seed"] = call_seed(rollout.seed, turn)
    if text_only:
        for k in ("logprobs", "top_logprobs", "return_token_ids"):
            up.pop(k, None)
    else:
        up["logprobs"] = True
        up["top_logprobs"] = 0
        up["return_token_ids"] = True
    # vLLM drops token_ids from the answer when a reasoning parser handles include_reasoning.
    up.pop("include_reasoning", None)
    limits = [v for v in (req.get("max_tokens"), req.get("max_completion_tokens"))
              if isinstance(v, int) and not isinstance(v, bool)]
    up.pop("max_completion_tokens", None)
    if max_tokens is not None:
        limits.append(max_tokens)
    if limits and room is not None and room >= 1:
        limits.append(room)
    if limits:
        up["max_tokens"] = min(limits)
    if req.get("stream"):
        up["stream_options"] = {**(req.get("stream_options") or {}), "include_usage": True}
    sampling = dict(up) if full else {k: v for k, v in up.items() if k not in ("messages", "tools")}
    if notes:
        sampling[NOTES] = notes
    return jsonx.dumps(up), sampling


def call_seed(rollout_seed: int, turn: int) -> int:
    """The seed the proxy sends upstream for a rollout's call `turn`: each call of a rollout draws
    its own tokens, and the same ones again when the rollout is replayed."""
    return (rollout_seed + turn) % 2**31


def requested_max_tokens(req: dict, cap: int | None) -> int | None:
    """The max_tokens a call will ask upstream before the context cap (None: the upstream decides)."""
    limits = [v for v in (req.get("max_tokens"), req.get("max_completion_tokens"), cap)
              if isinstance(v, int) and not isinstance(v, bool)]
    return min(limits) if limits else None


async def http_failure(resp: aiohttp.ClientResponse) -> UpstreamFailure:
    """A non-200 answer; an OpenAI-style error body is kept to be passed on as is."""
    return failure_of(resp.status, await resp.read())


# vLLM's answer for a model name it does not serve (a LoRA never loaded there, or lost in a restart)
_NO_SUCH_MODEL = re.compile(rb"model [`'\"]?[^`'\"]*[`'\"]? does not exist", re.I)


def failure_of(status: int, body: bytes) -> UpstreamFailure:
    try:
        err = jsonx.loads(body)
        msg = err.get("error", {}).get("message") if isinstance(err.get("error"), dict) else err.get("message")
        msg = msg or body[:500].decode("utf-8", "replace")
        ok_body = isinstance(err.get("error"), dict)
    except (ValueError, AttributeError):
        msg, ok_body = body[:500].decode("utf-8", "replace"), False
    return UpstreamFailure(status, f"upstream answered {status}: {msg}", f"http_{status}", body if ok_body else None)


class Forwarder:
    """Sends a rollout's calls to its upstream (sticky, see upstreams.py) over one shared session."""

    def __init__(self, cfg: RunConfig, pool: UpstreamPool):
        self.pool = pool
        self.timeout_s = cfg.proxy.upstream_timeout_s
        self._timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        self.headers = {"Content-Type": JSON}
        if cfg.endpoint.api_key:  # the endpoint's key (vLLM --api-key), never the agent's rollout key
            self.headers["Authorization"] = f"Bearer {cfg.endpoint.api_key}"
        self.session: aiohttp.ClientSession | None = None
        self.config_max_model_len = cfg.proxy.max_model_len
        self.max_model_len: dict[str, int] = {}  # per upstream url, as its /tokenize reported

    def timed_out(self, where: str = "upstream") -> UpstreamFailure:
        return UpstreamFailure(504, f"{where} timed out after {self.timeout_s:g} s", "timeout")

    async def send(self, rollout_id: str, body: bytes) -> aiohttp.ClientResponse:
        """POST to the rollout's upstream; a refused connection (nothing sent) fails over to the next."""
        last: Exception | None = None
        for up in self.pool.order(rollout_id):
            try:
                resp = await self.session.post(up.chat_url, data=body, headers=self.headers, timeout=self._timeout)
                if resp.status != 404:
                    return resp
                # A replica that does not serve the policy (restarted: its runtime LoRAs are gone) is
                # named and routed around; the call goes to the next replica, not back to the agent.
                try:
                    text = await resp.read()
                finally:
                    resp.release()
                if not _NO_SUCH_MODEL.search(text) or not self.pool.refuse(rollout_id, up, text[:200].decode("utf-8", "replace")):
                    raise failure_of(404, text)
                last = failure_of(404, text)
            except aiohttp.ClientConnectorError as e:
                up.mark_down(f"{type(e).__name__}: {e}")
                last = e
            except asyncio.TimeoutError:
                raise self.timed_out(f"upstream {up.url}") from None
            except aiohttp.ClientError as e:
                raise UpstreamFailure(502, f"upstream {up.url} failed: {type(e).__name__}: {e}",
                                      "connection") from None
        if isinstance(last, UpstreamFailure):
            raise last  # every replica answered that it does not serve the policy
        raise UpstreamFailure(502, f"no upstream reachable (last: {last})", "unreachable")

    async def open_stream(self, rollout_id: str, body: bytes) -> aiohttp.ClientResponse:
        """The upstream's 200 streaming answer, its body still unread."""
        resp = await self.send(rollout_id, body)
        if resp.status != 200:
            try:
                raise await http_failure(resp)
            finally:
                resp.release()
        return resp

    async def complete(self, rollout_id: str, body: bytes) -> dict:
        """A non-streaming call's answer as a JSON object."""
        resp = await self.send(rollout_id, body)
        try:
            if resp.status != 200:
                raise await http_failure(resp)
            raw = await resp.read()
        except asyncio.TimeoutError:
            raise self.timed_out() from None
        except aiohttp.ClientError as e:
            raise UpstreamFailure(502, f"upstream answer broken off: {type(e).__name__}: {e}",
                                  "connection") from None
        finally:
            resp.release()
        try:
            data = jsonx.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            raise UpstreamFailure(502, f"upstream answer is not valid JSON ({e})", "bad_json") from None
        return data

    async def tokenize(self, rollout_id: str, body: dict) -> dict:
        """The upstream's /tokenize answer ({count, max_model_len, ...}; vLLM and the local engine
        have it); {} when it gives none. A max_model_len it reports is remembered per upstream."""
        up = self.pool.order(rollout_id)[0]
        try:
            async with self.session.post(up.base + "/tokenize", data=jsonx.dumps(body), headers=self.headers,
                                         timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status == 200:
                    out = await resp.json()
                    if isinstance(out, dict):
                        if isinstance(out.get("max_model_len"), int):
                            self.max_model_len[up.url] = out["max_model_len"]
                        return out
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            pass
        return {}

    async def count_tokens(self, rollout_id: str, body: dict) -> int | None:
        """The upstream's /tokenize count; None when it gives none."""
        n = (await self.tokenize(rollout_id, body)).get("count")
        return n if isinstance(n, int) else None

    async def context_room(self, rollout_id: str, chat: dict, policy: str, want: int | None) -> int | None:
        """Tokens the upstream's context leaves after this call's prompt, when asking `want` might not
        fit; None when it surely fits, or nothing says how long the context is. /tokenize is asked only
        when the prompt's bytes (a bound on its tokens) plus `want` could pass the window."""
        if want is None:
            return None
        url = self.pool.order(rollout_id)[0].url
        limit = self.config_max_model_len or self.max_model_len.get(url)
        if limit == _UNKNOWN:  # this upstream's /tokenize tells no context length: do not ask per call
            return None
        if limit is not None:
            bound = len(jsonx.dumps([chat.get("messages"), chat.get("tools")])) + _TEMPLATE_SLACK
            if bound + want <= limit:
                return None
        body = {"model": policy, "messages": chat.get("messages"), "add_generation_prompt": True}
        if chat.get("tools"):
            body["tools"] = chat["tools"]
        out = await self.tokenize(rollout_id, body)
        limit = self.config_max_model_len or out.get("max_model_len")
        if not isinstance(out.get("count"), int) or not isinstance(limit, int):
            self.max_model_len.setdefault(url, _UNKNOWN)
            return None
        return limit - out["count"]
