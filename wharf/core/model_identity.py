"""One model per run: the model the trainer trains is the one the endpoint serves.

One key names it: train.model when set, else the served model's own key (engine.model for the
local engine, endpoint.model for vLLM, which `vllm serve` is given). A train.model that names
another model than the served one is refused before anything runs (`trained_model`), in one line
naming both. The loop then checks it live before round 0 (`check_served`): the endpoint's root
for endpoint.model (vLLM's /v1/models `root`: the path or hub id it loaded) must be that model,
and its prompt_token_ids for a rendered chat must equal the trainer's tokenizer's.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from wharf.core.chat_template import render_prompt_ids
from wharf.core.config import RunConfig
from wharf.core.endpoint import Endpoint, EndpointError
from wharf.core.model_store import HUB_ID, ModelError, load_chat, resolve_model_dir

log = logging.getLogger("wharf.loop")

# A chat whose tokens differ between two tokenizers of different families or vocabularies:
# a system turn, punctuation, accents, tabs and runs of spaces.
PROBE = [{"role": "system", "content": "You are a careful coding agent."},
         {"role": "user", "content": "Fix parse_args() in café.py:\tit drops  \"--flag=1\" (see #12)."}]


@dataclass(frozen=True)
class ModelRef:
    key: str  # the config key that names it
    given: str | None  # as written there (None: the embedded model)
    path: Path  # its local dir

    def __str__(self) -> str:
        if self.given is None:
            return f"the embedded model ({self.path})"
        return f"{self.key}={self.given!r} ({self.path})"

    @property
    def name(self) -> str:
        """Its last path part (a hub id's repo name), for a root this machine cannot look up."""
        return (self.given or str(self.path)).rstrip("/").rsplit("/", 1)[-1]

    def same(self, other: ModelRef) -> bool:
        return self.path.resolve() == other.path.resolve() or (self.given is not None and self.given == other.given)


def served_key(cfg: RunConfig) -> tuple[str, str | None]:
    """The key that names the served base model, and its value."""
    if cfg.endpoint.kind == "vllm":
        return "endpoint.model", cfg.endpoint.model
    return "engine.model", cfg.engine.model


def model_ref(given: str | None, key: str) -> ModelRef:
    return ModelRef(key, given, resolve_model_dir(given, key))


def trained_model(cfg: RunConfig) -> ModelRef:
    """The model the trainer trains (and convert renders for), refusing a train.model that is
    not the served one where that can be told from the config."""
    key, served = served_key(cfg)
    if cfg.train.model is None:
        try:
            return model_ref(served, key)
        except ModelError:
            if key != "endpoint.model":
                raise
            raise ModelError(f"train.model is unset, so the trainer loads what vLLM serves, endpoint.model={served!r}, "
                             "which is neither a local model dir nor a hub id in the local Hugging Face cache: set "
                             "train.model to the served model (its dir, or its cached hub id)") from None
    trained = model_ref(cfg.train.model, "train.model")
    if key == "endpoint.model" and not _local(served):
        return trained  # a name only vLLM knows (--served-model-name, a remote path): checked live
    other = model_ref(served, key)
    if not trained.same(other):
        what = "the local engine serves" if key == "engine.model" else "vLLM serves"
        raise ModelError(f"train.model={cfg.train.model!r} ({trained.path}) but {what} {other}: a run trains the "
                         f"model it samples from; leave train.model unset (it follows {key}) or make them the same")
    return trained


def _local(given: str | None) -> bool:
    """Whether this machine can look `given` up: a dir with config.json, or a cached hub id."""
    try:
        resolve_model_dir(given, "endpoint.model")
        return True
    except ModelError:
        return False


def root_matches(root: str, trained: ModelRef) -> bool:
    """Whether the endpoint's `root` (the path or hub id it loaded) is the trained model."""
    if root in (trained.given, str(trained.path)):
        return True
    if Path(root).exists() or HUB_ID.match(root):
        try:
            return Path(resolve_model_dir(root, "root")).resolve() == trained.path.resolve()
        except ModelError:
            pass  # a hub id this machine has not cached: by name
    return root.rstrip("/").rsplit("/", 1)[-1] == trained.name


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check_served(ep: Endpoint, cfg: RunConfig, trained: ModelRef) -> None:
    """Stop unless the endpoint serves the trained model: its root, then its tokens of PROBE
    against the trainer's tokenizer and template (rendered as the engine renders them)."""
    name = cfg.endpoint.model
    roots = ep.roots()
    if name not in roots:
        raise EndpointError(f"{ep.url} does not serve endpoint.model={name!r} (it serves {sorted(roots)}): set "
                            "endpoint.model to the served base model's name")
    root = roots[name]
    if root and not root_matches(root, trained):
        raise EndpointError(f"{ep.url} serves {name!r} from {root!r}, but the trainer trains {trained}: serve "
                            "that model, or set train.model to the one served")
    body = {"messages": PROBE, "max_tokens": 1, "return_token_ids": True, "temperature": 1.0, "top_p": 1.0}
    served = ep.chat(body).get("prompt_token_ids")
    if not served:
        raise EndpointError(f"{ep.url} returned no prompt_token_ids for return_token_ids=true: use vLLM >= 0.10.2 "
                            "(or the local engine)")
    tokenizer, style = load_chat(trained.path)
    ours = render_prompt_ids(tokenizer, PROBE, style=style)
    if served != ours:
        i = first_difference(served, ours)
        raise EndpointError(f"{ep.url} ({name!r} from {root!r}) tokenizes the probe chat into {len(served)} ids, "
                            f"the trainer's tokenizer ({trained}) into {len(ours)}, first apart at position {i}: "
                            "the served model is not the trained one; serve the same model and chat template")
    log.info("the endpoint serves the trained model: %s", trained)
