"""One collect round: every (task, attempt) as a harbor trial whose model calls go through the
recording proxy; rewards and statuses into rollouts.parquet, a summary into manifest.json.

Running the same round again resumes it: rollouts already in rollouts.parquet are kept; the
rest are run again under fresh rollout ids.

With runs_dir in object storage the round runs in its local mirror (wharf/core/storage.py): it pulls
what a resume needs, each proxy uploads each shard as it publishes it, rollouts.parquet goes up
as trials finish (rewritten in a thread of its own: RowsWriter), and the manifest last, once the
rest of the round is in the bucket.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
import uuid
from pathlib import Path

from tqdm import tqdm

from wharf.core import endpoint, lease, schema, storage
from wharf.collect.audit import orphan_turns, text_only_rollouts
from wharf.core.bundled import carried_note
from wharf.core.config import RunConfig, dump_config
from wharf.core.layout import JOB_FILES, WAL_DIR, CollectPaths
from wharf.core.round_state import require_manifest
from wharf.core.replicas import PublishRecord, replica_urls
from wharf.collect.executor import check_executor, make_executor
from wharf.collect.manifest import (RoundSummary, finished_fields, load_manifest, prefix_cache_summary,
                             started_manifest, write_json)
from wharf.collect.records import RolloutRow
from wharf.collect.tasksets import PlannedRollout, discover, plan
from wharf.collect.trials import preflight
from wharf.engine.launch import check_endpoint, launch

log = logging.getLogger("wharf.collect")


# What stays on the node when the round is in object storage: the proxies' WALs (one per node
# under Ray), and the resolved configs (written owner-only: they can hold API keys and the
# proxy's admin token; proxy-<node>.yaml under Ray).
LOCAL_ONLY = (f"turns/{WAL_DIR}/*", f"turns/{WAL_DIR}-*/*", "logs/proxy.yaml", "logs/proxy-*.yaml", "config.yaml")


def _push_round(paths: CollectPaths) -> None:
    """Everything the round made, the manifest last (a reader that sees it done sees the rest).
    The manifest is never withdrawn: the bucket holds the `running` one this run pushed at its
    start, so a push cut short leaves a round that says "not done" and keeps its job id."""
    storage.push(paths.root, last=(paths.manifest.name,), exclude=LOCAL_ONLY, withdraw=False)


def _shards(paths: CollectPaths) -> set[str]:
    return {p.name for p in paths.turns.glob("part-*.parquet")}


def _fold_shards(paths: CollectPaths) -> None:
    """Fold the round's shards into few; in object storage with every node's shards first, and the
    folded ones deleted from the bucket only after the shard that replaces them is there. Only the
    shards this fold read are deleted: one that lands in the bucket meanwhile stays."""
    storage.pull(paths.turns, ("part-*.parquet",))
    read = _shards(paths)
    schema.compact_dir(paths.turns, "turns")
    folded = read - _shards(paths)
    storage.push(paths.turns, exclude=(f"{WAL_DIR}/*", f"{WAL_DIR}-*/*"), remove=sorted(folded))


def save_rollouts(paths: CollectPaths, rows: list[RolloutRow]) -> bool:
    """The finished rows: on the local disk first (durably), then to the bucket. An upload that
    fails (a 503, expired credentials) keeps them on disk and is retried with the next trial's
    rows and at the round's end: a finished, scored rollout is never lost to the bucket."""
    schema.write_table(paths.rollouts, "rollouts", [r.as_dict() for r in rows])
    try:
        return storage.push_file(paths.rollouts)
    except storage.StorageError as e:
        log.warning("uploading %d finished rollouts failed (kept on disk; retried after the next trial): %s",
                    len(rows), e)
        return False


class RowsWriter:
    """rollouts.parquet rewritten and uploaded off the event loop that dispatches trials: one write
    at a time in a thread of its own, always of the newest rows (rows that finish during a write
    go out together in the next one), so a cluster's completions never wait on a table rewrite,
    two fsyncs and an upload each. `drain()` waits for the last write (and raises its error)."""

    def __init__(self, paths: CollectPaths):
        self.paths = paths
        self._lock = threading.Lock()
        self._pending: list[RolloutRow] | None = None
        self._worker: threading.Thread | None = None
        self.writes = 0

    def submit(self, rows: list[RolloutRow]) -> None:
        with self._lock:
            self._pending = list(rows)
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="wharf-rollouts", daemon=True)
                self._worker.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                rows, self._pending = self._pending, None
                if rows is None:
                    self._worker = None
                    return
            try:
                save_rollouts(self.paths, rows)
                self.writes += 1
            except lease.LeaseLost as e:  # another driver holds the run: drain's write says so and stops
                log.error("%s", e)
            except Exception:  # noqa: BLE001 - a disk error: the next write (or drain's) tries again
                log.exception("writing %s failed; retried with the next finished trial", self.paths.rollouts)

    def drain(self, rows: list[RolloutRow]) -> None:
        """Wait for the writes under way, then write `rows` (every finished row) once more, here."""
        with self._lock:
            worker, self._pending = self._worker, None
        if worker is not None:
            worker.join()
        save_rollouts(self.paths, rows)


def _load_done(paths: CollectPaths) -> list[RolloutRow]:
    if not paths.rollouts.exists():
        return []
    return [RolloutRow.from_dict(r) for r in schema.read_table(paths.rollouts, "rollouts").to_pylist()]


def round_job_id(paths: CollectPaths, round_index: int, prev: dict, done: list[RolloutRow]) -> str:
    """The round's job id: its manifest's when it is resumed (every row's GRPO group carries it), a
    new one for a new round; rows with no manifest are refused (their job id is unknown)."""
    require_manifest(paths, round_index, bool(done) and not prev)
    return prev.get("job_id") or uuid.uuid4().hex


class Round:
    def __init__(self, cfg: RunConfig, config_path: Path):
        """`config_path`: where the proxy process's config file is written."""
        self.cfg = cfg
        self.config_path = config_path
        self.paths = cfg.round_layout.collect
        self.policy = cfg.collect.policy or cfg.endpoint.model
        self.writer = RowsWriter(self.paths)

    def _prefix_counters(self) -> tuple[float, float] | None:
        """The prefix-cache counters summed over every replica the proxy routes to; None when one
        lacks them (no /metrics, cache off) or the endpoint is a text-only teacher."""
        if self.cfg.proxy.text_only:
            return None
        total = (0.0, 0.0)
        for url in replica_urls(self.cfg.endpoint.url, self.cfg.proxy.upstreams):
            c = endpoint.Endpoint(url, self.cfg.endpoint.api_key).prefix_cache_counters()
            if c is None:
                return None
            total = (total[0] + c[0], total[1] + c[1])
        return total

    def _record(self, summary: RoundSummary, bar: tqdm, row: RolloutRow, node: str) -> None:
        """A finished trial, in the driver: the whole table is rewritten (atomically) and uploaded
        by the writer's thread, not here, so the dispatch loop goes on at once; a killed round
        loses at most the rows finished during the write under way (resume runs them again)."""
        summary.rows.append(row)
        summary.nodes[node] = summary.nodes.get(node, 0) + 1
        self.writer.submit(summary.rows)
        bar.update(1)
        failed = sum(1 for r in summary.rows if r.status != "ok")
        mean = summary.mean_reward
        bar.set_postfix(failed=failed, reward=f"{mean:.2f}" if mean is not None else "-")

    def plan(self) -> tuple[list, list[PlannedRollout], list[RolloutRow], list[PlannedRollout]]:
        """Tasks, planned rollouts, rows already finished, and the rollouts still to run."""
        cc = self.cfg.collect
        tasks = discover(cc.dataset, cc.tasks)
        planned = plan(tasks, cc.attempts)
        self.paths.root.mkdir(parents=True, exist_ok=True)
        storage.pull(self.paths.root, JOB_FILES)  # a round resumed on another machine
        done = _load_done(self.paths)
        done_keys = {(r.task_id, r.attempt) for r in done}
        todo = [p for p in planned if (p.task.task_id, p.attempt) not in done_keys]
        return tasks, planned, done, todo

    async def run(self, progress: bool = True) -> RoundSummary:
        tasks, planned, done, todo = self.plan()
        preflight(self.cfg.collect)
        prev = load_manifest(self.paths)
        job_id = round_job_id(self.paths, self.cfg.round, prev, done)
        summary = RoundSummary(job_id=job_id, planned=len(planned), rows=list(done), resumed=len(done))
        started = time.time()
        manifest = started_manifest(self.cfg, self.policy, [t.task_id for t in tasks], job_id, prev)
        write_json(self.paths.manifest, manifest)
        storage.push_file(self.paths.manifest)
        if done:
            log.info("resuming round %d: %d of %d rollouts already done", self.cfg.round, len(done), len(planned))

        executor_info: dict = {}
        counters = await asyncio.to_thread(self._prefix_counters) if todo else None
        if todo:
            executor_info = await self._run_trials(summary, todo, job_id, progress)
        summary.prefix_cache = prev.get("prefix_cache")  # a finished round's, or a resumed one's so far
        if counters is not None:
            summary.prefix_cache = prefix_cache_summary(counters, await asyncio.to_thread(self._prefix_counters),
                                                        summary.prefix_cache)
        orphaned = orphan_turns(self.paths)  # rows of rollouts a killed run never finished: convert ignores them
        summary.text_only = text_only_rollouts(self.paths)
        manifest.update(finished_fields(summary, len(planned), orphaned,
                                        prev.get("wall_s", 0.0) + time.time() - started))
        if summary.prefix_cache is not None:
            manifest["prefix_cache"] = summary.prefix_cache
        if self.cfg.collect.executor != "local":  # which node ran how many of this run's trials
            manifest["executor"] = {"kind": self.cfg.collect.executor, **executor_info,
                                    "trials_by_node": dict(sorted(summary.nodes.items()))}
        write_json(self.paths.manifest, manifest)
        _push_round(self.paths)
        return summary

    async def _run_trials(self, summary: RoundSummary, todo: list[PlannedRollout], job_id: str,
                          progress: bool) -> dict:
        """Run the rollouts still to do, recording each as it finishes; returns the executor's info."""
        executor = make_executor(self.cfg, self.policy, self.config_path)
        with tqdm(total=summary.planned, initial=len(summary.rows), desc=f"round {self.cfg.round} rollouts",
                  unit="rollout", disable=not progress) as bar:
            try:
                info = await executor.run(todo, job_id, lambda row, node: self._record(summary, bar, row, node))
            finally:  # every finished row on disk, also when the round stops
                await asyncio.to_thread(self.writer.drain, summary.rows)
        # Each proxy publishes a shard per closed rollout (durability first); fold them now
        # that every proxy has stopped, so a round is a few files, not thousands.
        _fold_shards(self.paths)
        return info


def with_refusals(cfg: RunConfig) -> RunConfig:
    """`cfg` with proxy.refused naming the replicas that refused this round's policy when it was
    published, so that the proxy routes none of its calls there."""
    policy = cfg.collect.policy or cfg.endpoint.model
    record = PublishRecord.read(cfg.layout.published(policy))
    if record is None or not record.refused:
        return cfg
    log.warning("%s is not served by %s (it refused the adapter): no calls go there", policy, ", ".join(record.refused))
    refused = {**cfg.proxy.refused, policy: sorted(record.refused)}
    return dataclasses.replace(cfg, proxy=dataclasses.replace(cfg.proxy, refused=refused))


def check_collect(cfg: RunConfig) -> None:
    """The checks that cost little, cheapest first, before anything is written or started (the
    endpoint takes seconds to minutes): the executor's package, the dataset and its tasks, the
    agent and environment classes."""
    check_executor(cfg)
    discover(cfg.collect.dataset, cfg.collect.tasks)
    preflight(cfg.collect)


def run(cfg: RunConfig, progress: bool = True) -> RoundSummary:
    check_collect(cfg)
    if load_manifest(cfg.round_layout.collect).get("state") != "done":  # a finished round needs no endpoint
        check_endpoint(cfg)  # one not ours to start must answer; one we start must be startable
    note = carried_note(cfg.collect.dataset)  # the bundled tasks, read from any directory after pip install
    if note:
        log.info("%s", note)
    cfg = with_refusals(cfg)
    with lease.held(cfg.layout.root, "wharf collect"):  # one writer per run (a loop's own collect: its lease)
        return _run_held(cfg, progress)


def _run_held(cfg: RunConfig, progress: bool) -> RoundSummary:
    paths = cfg.round_layout.collect
    paths.root.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, paths.config)
    dump_config(cfg, cfg.layout.config)
    rnd = Round(cfg, paths.proxy_config)
    if not rnd.plan()[3]:  # a finished round: nothing to sample, so no endpoint to start
        return asyncio.run(rnd.run(progress=progress))
    # The endpoint outlives the round's proxy: started here only when nothing answers at its url.
    with launch(cfg, log_dir=paths.logs) as ep:
        # The proxy forwards with the endpoint's key (drawn by launch when it started the endpoint).
        return asyncio.run(Round(endpoint.with_key(cfg, ep), paths.proxy_config).run(progress=progress))
