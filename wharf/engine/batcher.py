"""The generation loop: one worker thread batches every running sequence together.

Each iteration admits whatever is waiting (prefilled as its own left-padded batch, then merged
into the running batch's KV cache), runs one decode step for all running sequences, streams each
sampled token back to its request, and drops the sequences that finished. Requests therefore
join and leave independently; nothing waits for a whole batch to end.

With a prefix cache (prefix_cache.py), a prompt's stored leading tokens are not computed again:
the prefill starts from their KV. Prompts admitted together that share more than the cache
holds are prefilled in turn, the first alone, so the others find its KV. A finished sequence's
KV (prompt and answer) is stored for the next call of its rollout.

All model calls happen on this one thread; adapter loads run on it too, between steps.
A sequence and when it stops are in sequence.py, the tokens a step draws in sampling.py, the
batch's KV layout (merging batches, dropping rows) in kv.py.
"""
from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from typing import Any, Callable

import torch
from transformers import DynamicCache

from .kv import PrefillRow, is_slack, keep_rows, merge_rows, prefill_batch, row_kv, slack_cache
from .prefix_cache import PrefixCache, common_prefix
from .cpu_race import Race
from .sampling import next_tokens
from .sequence import Done, Failed, Sequence, Token, stop_of

log = logging.getLogger("wharf.engine")

# A prompt admitted beside another waits for that one's KV when they share more than this many
# tokens beyond what the cache holds (fewer are cheaper to compute again than a pass to wait).
MIN_SHARED = 32


class Batcher:
    """Owns the model; `submit` sequences from any thread, `call` work on the model thread."""

    def __init__(self, model, tokenizer, *, max_model_len: int, max_batch: int,
                 eos_ids: set[int], prefill_tokens: int = 8192, seed: int = 0,
                 forward_model: Callable[[list[str | None]], Any] | None = None,
                 adapter_ok: Callable[[str], bool] = lambda name: False,
                 prefix_cache: PrefixCache | None = None,
                 cache_key: Callable[[str | None], Any] = lambda adapter: adapter,
                 race: Race | None = None, decode: Callable | None = None):
        self.tok = tokenizer
        self.race = race  # wharf/engine/cpu_race.py: torch's draws, faster (None: torch's own)
        # wharf/engine/cpu_layer.py: a decode step's layers in fewer operators, or None where the model
        # must run that pass itself (None: always the model)
        self._decode = decode
        self.device = next(model.parameters()).device
        self._model = model
        # Given each row's adapter (None: the base), the adapter registry readies the model's
        # weights for that pass and returns the model; asked before every forward pass.
        self._forward_model = forward_model or (lambda adapters: self._model)
        self._adapter_ok = adapter_ok
        self.prefix = prefix_cache
        # The identity of an adapter's weights now (None: the base): a prefix is reused only
        # under the identity that computed it.
        self._cache_key = cache_key
        self.max_model_len = max_model_len
        self.max_batch = max_batch
        self.eos_ids = set(eos_ids)
        self.prefill_tokens = prefill_tokens
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self._rng = torch.Generator().manual_seed(seed)
        self._waiting: queue.SimpleQueue[Sequence] = queue.SimpleQueue()
        self._calls: queue.SimpleQueue[tuple[Callable, concurrent.futures.Future]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine-batcher", daemon=True)
        # Batch state (model thread only): rows of `running` match rows of the cache and mask.
        self.running: list[Sequence] = []
        self._cache = None  # kv.slack_cache: the running rows' KV
        self._mask: torch.Tensor | None = None  # [B, L] bool, False where left padding
        self.steps = 0
        self.peak_batch = 0
        self.generated = 0

    # -- any thread --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)

    def submit(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            self._waiting.put(s)
        self._wake.set()

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn` on the model thread between steps (adapter loads); returns its future."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((fn, fut))
        self._wake.set()
        return fut

    # -- model thread --------------------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while not self._stop.is_set():
            try:
                self._run_calls()
                self._drop_cancelled()
                new = self._take_waiting()
                if new:
                    self._admit(new)
                if self.running:
                    self._decode_step()
                elif not new:
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
            except Exception as e:  # keep serving: fail what was in flight, not the server
                log.exception("generation step failed")
                for s in self.running:
                    self._finish(s, Failed(f"engine error: {type(e).__name__}: {e}"))
                self._reset_batch()

    def _run_calls(self) -> None:
        while True:
            try:
                fn, fut = self._calls.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)

    def _take_waiting(self) -> list[Sequence]:
        new = []
        while len(self.running) + len(new) < self.max_batch:
            try:
                s = self._waiting.get_nowait()
            except queue.Empty:
                break
            if s.cancelled:
                continue
            if s.adapter is not None and not self._adapter_ok(s.adapter):
                # Unloaded while the request waited.
                self._finish(s, Failed(f"the LoRA adapter '{s.adapter}' is not loaded"))
                continue
            new.append(s)
        return new

    def _reset_batch(self) -> None:
        self.running, self._cache, self._mask = [], None, None

    def _finish(self, s: Sequence, event: Done | Failed) -> None:
        if not s.finished:
            s.finished, s.failed = True, isinstance(event, Failed)
            s.emit(event)

    def _forward(self, input_ids, mask4d, position_ids, cache, adapters):
        model = self._forward_model(adapters)
        logits = None if self._decode is None else self._decode(model, input_ids, mask4d, position_ids, cache)
        if logits is not None:
            return logits, cache
        out = model(input_ids=input_ids, attention_mask=mask4d, position_ids=position_ids,
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :], out.past_key_values

    def _admit(self, new: list[Sequence]) -> None:
        pending = sorted(new, key=lambda s: len(s.prompt_ids))
        while pending:
            now, pending = self._plan(pending)
            # Prefill in chunks so a burst of long prompts does not allocate a huge attention matrix.
            for group in ([s for s in now if not s.hit], [s for s in now if s.hit]):
                chunk: list[Sequence] = []
                for s in group:
                    if chunk and self._prefill_cost(chunk + [s]) > self.prefill_tokens:
                        self._prefill(chunk)
                        chunk = []
                    chunk.append(s)
                if chunk:
                    self._prefill(chunk)

    @staticmethod
    def _prefill_cost(seqs: list[Sequence]) -> int:
        return len(seqs) * (max(s.hit for s in seqs) + max(len(s.prompt_ids) - s.hit for s in seqs))

    def _plan(self, seqs: list[Sequence]) -> tuple[list[Sequence], list[Sequence]]:
        """Those to prefill now (each with its cache hit), and those waiting for one of them."""
        if self.prefix is None:
            return seqs, []
        now, later, now_ids = [], [], []
        for s in seqs:
            s.cache_key = self._cache_key(s.adapter)
            ids = torch.tensor(s.prompt_ids, dtype=torch.long)
            s.hit, s.past = self.prefix.match(s.cache_key, ids)
            shared = max((common_prefix(t, ids) for t, o in zip(now_ids, now) if o.cache_key == s.cache_key),
                         default=0)
            if min(shared, len(ids) - 1) > s.hit + MIN_SHARED:
                later.append(s)
            else:
                now.append(s)
                now_ids.append(ids)
        return now, later

    def _prefill(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            if s.params.seed is not None and s.generator is None:
                s.generator = torch.Generator().manual_seed(s.params.seed)
            elif s.generator is None:
                s.generator = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=self._rng)))
        rows = [PrefillRow(s.prompt_ids, s.hit, s.past.kv if s.hit else None) for s in seqs]
        for s in seqs:
            s.past = None  # the batch holds its own copy
        batch = prefill_batch(rows, self.pad_id)
        # A stored prefix goes into a slack cache with room for the prefill: the forward writes
        # its columns in place, and a batch that runs alone keeps that cache as it is.
        past = DynamicCache() if batch.past is None else slack_cache(
            ((k.to(self.device), v.to(self.device)) for k, v in batch.past), room=batch.ids.shape[1])
        logits, cache = self._forward(batch.ids.to(self.device), batch.mask4d.to(self.device),
                                      batch.position_ids.to(self.device), past, [s.adapter for s in seqs])
        if self.prefix is not None:
            for i, s in enumerate(seqs):
                self.prefix.count(len(s.prompt_ids), s.hit)
                self.prefix.store(s.cache_key, torch.tensor(s.prompt_ids, dtype=torch.long),
                                  lambda i=i: row_kv(cache.layers, i, batch.mask[i].to(self.device)))
        self._merge(seqs, cache, batch.mask)
        # Rows admitted here may finish at once (max_tokens=1, EOS first): _after_logits drops them.
        self._after_logits(seqs, logits)

    def _merge(self, seqs: list[Sequence], cache, mask: torch.Tensor) -> None:
        if self._cache is None:
            self.running, self._mask = list(seqs), mask
            self._cache = cache if is_slack(cache) else slack_cache((l.keys, l.values) for l in cache.layers)
            return
        self._cache, self._mask = merge_rows(self._cache, self._mask, cache, mask)
        self.running.extend(seqs)

    def _decode_step(self) -> None:
        B = len(self.running)
        self.peak_batch = max(self.peak_batch, B)
        last = torch.tensor([[s.output_ids[-1]] for s in self.running], dtype=torch.long)
        self._mask = torch.cat([self._mask, torch.ones((B, 1), dtype=torch.bool)], 1)
        position_ids = self._mask.long().sum(-1, keepdim=True) - 1
        logits, self._cache = self._forward(last.to(self.device), self._mask[:, None, None, :].to(self.device),
                                            position_ids.to(self.device), self._cache,
                                            [s.adapter for s in self.running])
        self.steps += 1
        self._after_logits(list(self.running), logits)

    def _after_logits(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        live = [s for s in seqs if not s.finished]
        if not live:
            return
        logits = logits.float().cpu()[[i for i, s in enumerate(seqs) if not s.finished]]
        chosen = next_tokens(logits, [s.params for s in live], [len(s.output_ids) for s in live], self.eos_ids,
                             [s.generator for s in live], self.race)
        for s, (tid, logprob, top) in zip(live, chosen):
            s.output_ids.append(tid)
            self.generated += 1
            s.emit(Token(tid, logprob, top))
            done = stop_of(s, tid, self.eos_ids, self.max_model_len,
                           lambda ids: self.tok.decode(ids, skip_special_tokens=True))
            if done is not None:
                self._finish(s, done)
        self._drop_finished()

    def fail_adapter(self, name: str, message: str) -> None:
        """Model thread only (via `call`): end the running sequences that use adapter `name`."""
        for s in self.running:
            if s.adapter == name:
                self._finish(s, Failed(message))
        self._drop_finished()

    def _drop_cancelled(self) -> None:
        for s in self.running:
            if s.cancelled:
                self._finish(s, Done("abort"))
        self._drop_finished()

    def _drop_finished(self) -> None:
        if not any(s.finished for s in self.running):
            return
        if self.prefix is not None:
            self._store_finished()
        keep = [i for i, s in enumerate(self.running) if not s.finished]
        if not keep:
            self._reset_batch()
            return
        # Columns that are padding in every remaining row carry nothing: keep_rows cuts them off.
        self._cache, self._mask = keep_rows(self._cache, self._mask, keep)
        self.running = [self.running[i] for i in keep]

    def _store_finished(self) -> None:
        """Keep each finished sequence's KV (prompt and answer but its last token, not yet fed)."""
        for i, s in enumerate(self.running):
            if s.finished and not s.failed and self._cache_key(s.adapter) == s.cache_key:
                cols = self._mask[i]
                n = int(cols.sum())
                ids = torch.tensor((s.prompt_ids + s.output_ids)[:n], dtype=torch.long)
                self.prefix.store(s.cache_key, ids, lambda i=i, cols=cols: row_kv(self._cache.layers, i, cols.to(self.device)))
