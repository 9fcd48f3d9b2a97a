"""The engine's model side: base model, tokenizer, LoRA adapters and the continuous batcher.

No HTTP here: the routes (server.py, chat_api.py, completions_api.py) turn requests into
`submit` calls and the events back into vLLM-shaped answers. The model is loaded through
model_store and sampled with sampling.processed_logprobs, the two pieces train shares.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from typing import Any

from wharf.core.config import EngineConfig
import logging

from wharf.core import cpu_linear, families, model_store
from .batcher import Batcher
from .sequence import Done, Failed, Sequence, Token
from .chat_format import render_prompt_ids, template_supports_tools
from .errors import internal, not_found
from .adapters import Adapters
from . import cpu_layer, cpu_race, tool_parsers
from .prefix_cache import PrefixCache
from .protocol import flag

log = logging.getLogger("wharf.engine")


class EngineCore:
    def __init__(self, cfg: EngineConfig):
        import torch

        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        self.cfg = cfg
        self.model_dir = model_store.resolve_model_dir(cfg.model)
        device = model_store.pick_device(cfg.device)
        model, self.tok = model_store.load_model(self.model_dir, device, cfg.dtype)
        log.info("engine: %s", families.describe(model.config))
        self.cpu_kernel = None
        if cfg.cpu_kernel and str(device) == "cpu" and cfg.dtype == "float32":
            self.cpu_kernel = cpu_linear.install(model, model_store.cache_dir() / "kernels")
        # Decode steps on the layer kernel, which runs the linear layers on the same C kernel.
        self.layer_kernel = cpu_layer.load(model, model_store.cache_dir() / "kernels") if self.cpu_kernel else None
        # Sampling runs on the CPU whatever the device: its race kernel serves either.
        self.race = cpu_race.load(model_store.cache_dir() / "kernels") if cfg.cpu_kernel else None
        self.max_model_len = min(cfg.max_model_len, getattr(model.config, "max_position_embeddings", 1 << 30))
        window = families.sliding_window(model.config)
        if window is not None and window < self.max_model_len:
            log.warning("engine: the model's sliding-window layers attend over %d tokens, the engine's attention "
                        "masks over all: max_model_len lowered from %d to %d", window, self.max_model_len, window)
            self.max_model_len = window
        gen = model.generation_config
        self.style = families.chat_style(model.config, gen, self.tok)
        fam = families.family_of(getattr(model.config, "model_type", None))
        self.tool_parser, why = tool_parsers.pick(cfg.tool_parser, fam.tool_parser if fam else None,
                                                  template_supports_tools(self.tok), self.tok.get_vocab())
        log.info("engine: tool calls read as %s (%s)", self.tool_parser.name, why)
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tok.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos])
        # Unset sampling fields default to the model's generation_config, as in vLLM.
        self.default_temperature = float(gen.temperature) if gen.do_sample and gen.temperature else 1.0
        self.default_top_p = float(gen.top_p) if gen.do_sample and gen.top_p else 1.0
        self.vocab = len(self.tok)
        self.adapters = Adapters(model, cfg.max_loras, cfg.merged_loras)
        self.prefix = PrefixCache(cfg.prefix_cache_mib << 20) if cfg.prefix_cache else None
        if self.prefix is not None:
            # A reloaded or unloaded adapter's entries can never match again: free them now.
            self.adapters.on_change = lambda name: self.prefix.forget(lambda key: key is not None and key[0] == name)
        self.batcher = Batcher(model, self.tok, max_model_len=self.max_model_len, max_batch=cfg.max_batch,
                               eos_ids=eos_ids, seed=cfg.seed, forward_model=self.adapters.select,
                               adapter_ok=lambda name: name in self.adapters.paths,
                               prefix_cache=self.prefix, cache_key=self.adapters.identity, race=self.race,
                               decode=self.layer_kernel)
        self.created = int(time.time())

    # -- tokens -----------------------------------------------------------------------------------
    @functools.lru_cache(maxsize=65536)
    def token_str(self, tid: int) -> str:
        return self.tok.decode([tid])

    def logprob_entry(self, t: Token) -> dict:
        """One position of a chat answer's logprobs.content, as vLLM writes it."""
        s = self.token_str(t.token_id)
        return {"token": s, "logprob": t.logprob, "bytes": list(s.encode("utf-8")),
                "top_logprobs": [{"token": self.token_str(j), "logprob": lp,
                                  "bytes": list(self.token_str(j).encode("utf-8"))} for j, lp in t.top]}

    def text_of(self, ids: list[int], stop_reason) -> str:
        text = self.tok.decode(ids, skip_special_tokens=True)
        if isinstance(stop_reason, str) and stop_reason in text:
            text = text[:text.index(stop_reason)]
        return text

    def answer_text(self, ids: list[int], done: Done, keep_special: bool) -> str:
        """A finished answer's text; with `keep_special`, special tokens are kept in it (as vLLM's
        skip_special_tokens=false), all but the token it stopped on."""
        if not keep_special:
            return self.text_of(ids, done.stop_reason)
        if ids and done.finish_reason == "stop" and not isinstance(done.stop_reason, str):
            ids = ids[:-1]  # the eos or stop token id it ended on, which vLLM leaves out of the text
        text = self.tok.decode(ids, skip_special_tokens=False)
        if isinstance(done.stop_reason, str) and done.stop_reason in text:
            text = text[:text.index(done.stop_reason)]
        return text

    def chat_prompt_ids(self, body: dict, tools: Any) -> list[int]:
        """A chat request's prompt ids (raises chat_format.ChatError on bad messages)."""
        return render_prompt_ids(self.tok, body["messages"], tools,
                                 add_generation_prompt=flag(body, "add_generation_prompt", True),
                                 continue_final_message=flag(body, "continue_final_message"),
                                 chat_template_kwargs=body.get("chat_template_kwargs"), style=self.style)

    def adapter_for(self, name: Any) -> str | None:
        """The adapter a request's `model` selects (None: the base model); 404 for an unknown name."""
        if name is None or name == self.cfg.served_name:
            return None
        if isinstance(name, str) and name in self.adapters.paths:
            return name
        raise not_found(f"The model `{name}` does not exist.", "model")

    # -- generation -------------------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], params, n: int, adapter: str | None):
        """Queue `n` samples of one prompt; their (index, event) pairs arrive on the returned queue."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        seqs = []
        for i in range(n):
            p = params if n == 1 or params.seed is None else dataclasses.replace(params, seed=params.seed + i)
            seqs.append(Sequence(list(prompt_ids), p, adapter=adapter,
                                 emit=lambda e, i=i: loop.call_soon_threadsafe(q.put_nowait, (i, e))))
        self.batcher.submit(seqs)
        return seqs, q

    async def collect(self, seqs, q) -> list[tuple[list[Token], Done]]:
        """Every sample's tokens and end, once all have finished."""
        toks: list[list[Token]] = [[] for _ in seqs]
        ends: list[Done | None] = [None] * len(seqs)
        while any(e is None for e in ends):
            i, ev = await q.get()
            if isinstance(ev, Token):
                toks[i].append(ev)
            elif isinstance(ev, Failed):
                raise internal(ev.message)
            else:
                ends[i] = ev
        return list(zip(toks, ends))
