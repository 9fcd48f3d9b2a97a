"""Hand a trained adapter to every replica as the run's policy-v<k+1> (`<run>-<h>-policy-v<k+1>`:
per run, wharf/core/names.py), and check that the name serves.

`POST /v1/load_lora_adapter` with a new name and a new directory every round (never a reload in
place: vLLM can reuse stale prefix-cache blocks under an old name). The same API on vLLM and
the local engine. A failed publish leaves the adapter on disk; `make publish` tries again.

`wharf publish --config FILE [k=v ...]` publishes round `round`'s adapter.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from wharf.core import storage
from wharf.core.config import RunConfig, cli_config
from wharf.core.endpoint import Endpoint, EndpointError
from wharf.core.entry import guarded
from wharf.core.errors import WharfError
from wharf.core.layout import RunLayout, has_adapter, init_adapter_dir
from wharf.core.names import policy_version, weights_digest
from wharf.core.replicas import PublishRecord, ReplicaResult, replica_urls, same_adapter, serves_ours

log = logging.getLogger("wharf.train")


class PublishError(WharfError, RuntimeError):
    """The endpoint refused the adapter or does not serve it afterwards; the adapter stays on disk."""


@dataclass(frozen=True)
class _Publish:
    """One publish: what every replica gets. `keep`: how many policies before `name` stay loaded
    (rounds still sampling from them); `ours`: whether a served adapter's root is this run's (another
    run's is never unloaded); `weights`: the adapter's sha256; `loaded`: {url: sha256 of what the
    record says that replica loaded as `name` before} (a retrained round: other weights, same dir)."""
    adapter_dir: Path
    name: str
    resume: bool
    keep: int
    ours: Callable[[str | None], bool]
    weights: str | None
    loaded: dict[str, str | None]
    tag: str | None = None  # the run's policy-name prefix: only its own versions are ever unloaded


def publish(cfg: RunConfig, adapter_dir: Path, name: str, resume: bool = False) -> PublishRecord:
    """Load `adapter_dir` as `name` on every replica the proxy routes to (endpoint.url and
    proxy.upstreams: a load reaches only the server that receives it) and check each. A replica
    that refuses is recorded (runs/<run>/published/<name>.json) so that the proxy routes no call
    for `name` there; only when every replica refuses does publishing fail. `resume`: a replica
    already serving `name` from this adapter (a loop killed mid-publish) is checked, not refused."""
    if not has_adapter(Path(adapter_dir)):
        raise PublishError(f"{adapter_dir}: no adapter to publish (adapter_config.json missing); run `wharf train` first")
    layout = RunLayout.of(cfg.runs_dir, cfg.name)
    mine = [layout.root, *filter(None, [init_adapter_dir(cfg.loop.init_adapter)])]
    before = PublishRecord.read(layout.published(name)) if resume else None
    job = _Publish(Path(adapter_dir), name, resume, max(1, cfg.loop.max_staleness),
                   lambda root: root is not None and any(_under(root, d) for d in mine), weights_digest(adapter_dir),
                   {r.url: r.weights for r in (before.replicas if before else [])}, layout.tag)
    record = PublishRecord(name, str(adapter_dir), [
        _publish_one(Endpoint(url, cfg.endpoint.api_key, cfg.endpoint.model), job)
        for url in replica_urls(cfg.endpoint.url, cfg.proxy.upstreams)])
    record.write(layout.published(name))
    if not record.serving:
        why = "; ".join(f"{url}: {e}" for url, e in record.refused.items())
        raise PublishError(f"publishing {adapter_dir} as {name!r} failed on every replica ({why}); the adapter "
                           "stays on disk, `wharf publish` retries")
    for url, why in record.refused.items():
        log.error("replica %s refused %s and gets none of its calls: %s", url, name, why)
    return record


def _publish_one(ep: Endpoint, job: _Publish) -> ReplicaResult:
    try:
        served = ep.roots()
        if job.name in served:
            _check_same(ep.url, job, served[job.name])
            verify(ep, job.name)
            return ReplicaResult(ep.url, True, weights=job.loaded.get(ep.url) or job.weights)
        # the policies that may still be sampling stay
        oldest = (policy_version(job.name, None, job.tag) or 0) - job.keep
        for old, root in served.items():
            v = policy_version(old, None, job.tag)
            if v is not None and v < oldest and job.ours(root):
                try:
                    ep.unload_adapter(old)
                except EndpointError as e:
                    log.warning("could not unload %s from %s: %s", old, ep.url, e)
        ep.load_adapter(job.name, job.adapter_dir)
        verify(ep, job.name)
    except (PublishError, EndpointError) as e:
        # what the replica holds under the name stays recorded: a retry is refused the same way
        return ReplicaResult(ep.url, False, str(e), weights=job.loaded.get(ep.url))
    return ReplicaResult(ep.url, True, weights=job.weights)


def _under(root: str, d: Path) -> bool:
    return same_adapter(root, d) or any(same_adapter(str(p), d) for p in Path(root).parents)


def _check_same(url: str, job: _Publish, root: str | None) -> None:
    """A replica already serving the name: only this very adapter (a resumed publish) is accepted.
    Another path is another run's policy of the same name (two runs sharing a fleet): its weights
    would be sampled as ours, and unloading it would break that run mid-collect. The same path with
    other weights than the replica loaded is a round trained again: the replica holds the old ones."""
    name = job.name
    if not serves_ours(root, name, job.adapter_dir):
        raise PublishError(f"{url} already serves {name!r} from {root}, not from {job.adapter_dir}: another run "
                           "(or an endpoint started with it) holds that name there; give each run its own "
                           f"replicas, or unload {name!r} from this one once its run is done")
    if not job.resume:
        raise PublishError(f"the endpoint at {url} already serves {name!r}; a name is never reloaded in place "
                           "(stale prefix cache): restart the endpoint or train the next round")
    was = job.loaded.get(url)
    if was and job.weights and was != job.weights:
        raise PublishError(f"{url} serves {name!r} with the weights it loaded before {job.adapter_dir} was trained "
                           f"again (sha256 {was[:12]}, now {job.weights[:12]}): unload {name!r} there "
                           "(POST /v1/unload_lora_adapter) or restart the replica, then `wharf publish`")


def verify(ep: Endpoint, name: str) -> list[str]:
    served = ep.models()
    if name not in served:
        raise PublishError(f"{ep.url} accepted {name!r} but /v1/models does not list it (it lists {served})")
    status, text = ep.request("POST", "/v1/completions", {"model": name, "prompt": "Hello", "max_tokens": 1,
                                                          "temperature": 0})
    if status != 200:
        raise PublishError(f"{ep.url} lists {name!r} but a completion with it fails ({status}: {text[:300]})")
    return served


def try_publish(cfg: RunConfig, adapter_dir: Path, name: str) -> tuple[bool, str]:
    """train_round's publish: (published, what happened). No endpoint answering is not an error
    (a replay trains without one); a refusal is logged with the way to retry."""
    ep = Endpoint(cfg.endpoint.url, cfg.endpoint.api_key, cfg.endpoint.model)
    if not ep.healthy():
        msg = (f"not published: nothing answers at {cfg.endpoint.url} (replay?); the adapter is in {adapter_dir}; "
               "start the endpoint and run `wharf publish` to serve it")
        log.warning(msg)
        return False, msg
    try:
        record = publish(cfg, adapter_dir, name)
    except (PublishError, EndpointError) as e:
        log.error("%s", e)
        return False, str(e)
    msg = f"published {adapter_dir} as {name} on {', '.join(record.serving)}"
    if record.refused:
        msg += f"; refused by {', '.join(record.refused)} (no calls for {name} go there)"
    log.info(msg)
    return True, msg


def main(argv: list[str] | None = None, prog: str = "wharf publish") -> int:
    cfg = cli_config(argv, prog, "Publish (again) the adapter round `round` trained, as policy-v<round+1>.")
    return guarded(prog, lambda: _publish(cfg))


def _publish(cfg: RunConfig) -> int:
    adapter = RunLayout.of(cfg.runs_dir, cfg.name).round(cfg.round).train.adapter
    storage.pull(adapter)  # a run in object storage: the adapter into this machine's mirror
    name = cfg.policy(cfg.round + 1)
    record = publish(cfg, adapter, name)
    print(f"published {adapter} as {name} on {', '.join(record.serving)}")
    for url, why in record.refused.items():
        print(f"refused by {url} (no calls for {name} go there): {why}")
    return 0
