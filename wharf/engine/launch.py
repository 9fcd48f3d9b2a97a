"""Start an endpoint when nothing answers: the local engine (`python -m wharf.engine`) or `vllm serve`,
with a random API key per run, stopped when the run ends. It lives beside the engine, not in the
shared floor, because it names the engine's program: collect and the loop use it."""
from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

from wharf.core import bundled, envdefaults, procs
from wharf.core.config import RunConfig
from wharf.core.credentials import new_token
from wharf.core.endpoint import Endpoint, EndpointError
from wharf.core.families import family_of
from wharf.core.model_store import resolve_model_dir

# The child starts where this copy of wharf is importable from (a checkout's root, or site-packages).
REPO_ROOT = bundled.PACKAGE_PARENT


def _check_served_name(cfg: RunConfig) -> None:
    if cfg.engine.served_name != cfg.endpoint.model:
        raise EndpointError(f"endpoint.model={cfg.endpoint.model!r} but the local engine would serve "
                            f"engine.served_name={cfg.engine.served_name!r}: make them the same")


def _engine_command(cfg: RunConfig, host: str, port: int, config_path: Path, api_key: str) -> list[str]:
    _check_served_name(cfg)
    # Where endpoint.url says it answers, with the key; the config file is owner-only.
    engine = dataclasses.replace(cfg.engine, host=host, port=port, api_key=api_key, model=_here(cfg.engine.model))
    return procs.stage_argv("wharf.engine", dataclasses.replace(cfg, engine=engine), config_path)


def _here(model: str | None) -> str | None:
    """A model dir named relative to this directory, made absolute: the engine starts in another
    (REPO_ROOT). Anything else (None, a name that is no path here) as it is."""
    return str(Path(model).absolute()) if model and Path(model).exists() and not Path(model).is_absolute() else model


def launch_key(cfg: RunConfig) -> str:
    """The API key an endpoint this run starts is given: the configured one, else a random one,
    so that nothing but this run (not a sandbox that reached its port) can sample or load adapters."""
    client, engine = cfg.endpoint.api_key, cfg.engine.api_key if cfg.endpoint.kind == "local" else None
    if client and engine and client != engine:
        raise EndpointError("endpoint.api_key and engine.api_key differ: the run would be refused by the engine "
                            "it starts; set one of them (or neither, for a random key per run)")
    return client or engine or new_token()



def _flag(args: list[str], name: str) -> str | None:
    """The value of `--name=V` or `--name V` in a command line; None when it is not there."""
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            return a.partition("=")[2]
        if a == name:
            return args[i + 1] if i + 1 < len(args) else ""
    return None


def _tool_parser_mismatch(model: str, args: list[str]) -> str | None:
    """vLLM reads tool calls with --tool-call-parser only; a model whose own chat template renders
    the tools writes them in its family's format (wharf/core/families.py). With another parser
    every call stays text, and each agent turn that calls a tool looks like a final answer."""
    given = _flag(args, "--tool-call-parser")
    if not given or _flag(args, "--chat-template") is not None:  # a template of the user's: their format
        return None
    root = Path(model)
    try:
        model_type = json.loads((root / "config.json").read_text()).get("model_type")
        template = json.loads((root / "tokenizer_config.json").read_text()).get("chat_template") or ""
    except (OSError, ValueError, AttributeError):
        return None  # not a local model dir (vLLM resolves a hub name itself): nothing to read here
    if (root / "chat_template.jinja").exists():
        template = (root / "chat_template.jinja").read_text(errors="replace")
    fam = family_of(model_type)
    if fam is None or fam.tool_parser == given or "tools" not in str(template):
        return None
    return (f"endpoint.vllm_args has --tool-call-parser={given}, but {model} is a {fam.name} model whose chat "
            f"template asks for {fam.tool_parser} tool calls: vLLM would read none of them; set "
            f"--tool-call-parser={fam.tool_parser}, or pass the --chat-template that asks for {given} calls")


def _vllm_command(cfg: RunConfig, host: str, port: int) -> list[str]:
    mismatch = _tool_parser_mismatch(cfg.endpoint.model, cfg.endpoint.vllm_args)
    if mismatch:
        raise EndpointError(mismatch)
    exe = shutil.which("vllm")
    if exe is None:
        raise EndpointError(f"endpoint.kind=vllm and nothing answers at {cfg.endpoint.url}, but vllm is not "
                            "installed here: `pip install -e .[vllm]` on a GPU host, start vLLM yourself, or use "
                            "endpoint.kind=local")
    if cfg.endpoint.api_key is None and any(a.split("=")[0] == "--api-key" for a in cfg.endpoint.vllm_args):
        raise EndpointError("endpoint.vllm_args has --api-key but endpoint.api_key is unset: set endpoint.api_key "
                            "to that key (or drop --api-key for a random key per run)")
    return [exe, "serve", cfg.endpoint.model, "--host", host, "--port", str(port), *cfg.endpoint.vllm_args]


def _nothing_answers(cfg: RunConfig) -> EndpointError:
    return EndpointError(f"nothing answers at {cfg.endpoint.url}/health and endpoint.launch is false: start the "
                         "endpoint (`wharf serve`) or set endpoint.launch=true")


def check_endpoint(cfg: RunConfig) -> None:
    """Before a command writes anything: an endpoint it will not start answers already, and one it
    would start has what starting it takes (keys that agree, the engine's name, the vllm program)."""
    ep_cfg = cfg.endpoint
    key = ep_cfg.api_key or (cfg.engine.api_key if ep_cfg.kind == "local" else None)  # as launch asks
    if cfg.proxy.text_only or Endpoint(ep_cfg.url, key, ep_cfg.model).healthy():
        return
    if not ep_cfg.launch:
        raise _nothing_answers(cfg)
    launch_key(cfg)
    if ep_cfg.kind == "local":
        _check_served_name(cfg)
        if cfg.engine.model is not None:  # a model dir that is not one: refused here, not in the engine's log
            resolve_model_dir(cfg.engine.model)  # (the embedded one is converted by the engine, when first needed)
    else:
        _vllm_command(cfg, "127.0.0.1", 0)


@contextmanager
def launch(cfg: RunConfig, log_dir: str | Path | None = None, check: bool = True) -> Iterator[Endpoint]:
    """An Endpoint for cfg.endpoint; starts the engine or vLLM when nothing answers (with
    launch_key's API key: pass the yielded Endpoint's api_key on, see with_key), stops it on exit."""
    ep_cfg = cfg.endpoint
    # A local engine already running from this same config (`make serve`) wants its engine.api_key.
    key = ep_cfg.api_key or (cfg.engine.api_key if ep_cfg.kind == "local" else None)
    ep = Endpoint(ep_cfg.url, key, ep_cfg.model)
    if cfg.proxy.text_only:  # a teacher (an API model, llama.cpp, ollama): never started here, no ids to check
        yield ep
        return
    proc = None
    log = None
    if not ep.healthy():
        if not ep_cfg.launch:
            raise _nothing_answers(cfg)
        parts = urlsplit(ep_cfg.url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        log = Path(log_dir or tempfile.mkdtemp(prefix="wharf-endpoint-")) / f"endpoint-{ep_cfg.kind}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        ep.api_key = launch_key(cfg)
        if ep_cfg.kind == "local":
            cmd = _engine_command(cfg, host, port, log.with_suffix(".yaml"), ep.api_key)
            env = envdefaults.child_env()
        elif ep_cfg.kind == "vllm":
            # VLLM_API_KEY is vLLM's --api-key (an --api-key in vllm_args wins), kept out of `ps`; no
            # HF_HUB_OFFLINE unless the person set it: vLLM may fetch the model it serves.
            cmd = _vllm_command(cfg, host, port)
            env = envdefaults.server_env(VLLM_ALLOW_RUNTIME_LORA_UPDATING="1", VLLM_API_KEY=ep.api_key)
        else:
            raise EndpointError(f"endpoint.kind={ep_cfg.kind!r}: expected local or vllm")
        # Its own session, so stopping it also stops what it spawned (vLLM's workers).
        proc = procs.spawn(cmd, log, env=env, cwd=REPO_ROOT)
    ep.process = proc
    try:
        if proc is not None:
            ep.wait_healthy(ep_cfg.startup_timeout_s, proc, log)
        if check:
            ep.check_capture()
        yield ep
    finally:
        if proc is not None:
            procs.stop(proc)
