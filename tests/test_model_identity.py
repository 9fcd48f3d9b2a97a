"""One model per run (wharf/core/model_identity.py), with two tiny local models of different
families (tests/tiny_families.py) in dirs of the same name: the trained model follows the served
model's key, a train.model the endpoint does not serve stops the loop before round 0's collect in
one line, the live check compares the endpoint's root and its tokens of a rendered chat, a hub id
resolves from a local Hugging Face cache (a real cache layout in a tmp dir), and HF_HUB_OFFLINE is
not forced on a vLLM that wharf starts."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import stat

import pytest

from testing.app_thread import AppThread
from tests.conftest import free_port
from tests.tiny_families import build
from wharf.core import envdefaults
from wharf.core.config import EngineConfig, load_config
from wharf.core.endpoint import Endpoint, EndpointError
from wharf.core.model_identity import check_served, model_ref, trained_model
from wharf.core.model_store import ModelError, resolve_model_dir
from wharf.engine.launch import launch
from wharf.engine.server import Engine, make_app
from wharf.pipeline.loop import main as loop_main

REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(A, B): a tiny Qwen2.5 and a tiny Llama 3, both in a dir named `tiny`."""
    root = tmp_path_factory.mktemp("models")
    return build("qwen2.5", root / "a" / "tiny"), build("llama3", root / "b" / "tiny")


@pytest.fixture(scope="module")
def served_a(models):
    """The local engine serving A as `m`, in this process: (Engine, URL)."""
    engine = Engine(EngineConfig(model=str(models[0]), served_name="m", device="cpu", threads=2))
    with AppThread(lambda: make_app(engine), name="engine-a") as app:
        yield engine, app.url


def cfg_of(*overrides: str):
    return load_config(None, list(overrides))


def one_line(e: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(e.value)
    return str(e.value)


def test_the_trained_model_follows_the_served_models_key(models):
    a, _ = models
    ref = trained_model(cfg_of(f"engine.model={a}"))
    assert (ref.key, ref.path) == ("engine.model", a)
    ref = trained_model(cfg_of("endpoint.kind=vllm", f"endpoint.model={a}"))  # not the embedded model
    assert (ref.key, ref.path) == ("endpoint.model", a)
    with pytest.raises(ModelError) as e:  # a served name only vLLM knows: the trainer cannot guess it
        trained_model(cfg_of("endpoint.kind=vllm", "endpoint.model=my-served-name"))
    assert "train.model is unset" in one_line(e) and "'my-served-name'" in str(e.value)


def test_a_train_model_the_endpoint_does_not_serve_is_refused_naming_both(models, tmp_path):
    a, b = models
    for kind, key in (("local", "engine.model"), ("vllm", "endpoint.model")):
        with pytest.raises(ModelError) as e:
            trained_model(cfg_of(f"endpoint.kind={kind}", f"{key}={a}", f"endpoint.model={a}" if kind == "vllm"
                                 else "endpoint.model=smollm2-135m", f"train.model={b}"))
        assert f"train.model='{b}'" in one_line(e) and f"{key}='{a}'" in str(e.value)
    assert trained_model(cfg_of(f"engine.model={a}", f"train.model={a}")).path == a
    with pytest.raises(ModelError) as e:  # the key that is wrong is the one named
        trained_model(cfg_of(f"engine.model={a}", f"train.model={tmp_path / 'nothing'}"))
    assert one_line(e).startswith("train.model=")
    from wharf.train.stage import train_round

    with pytest.raises(ModelError, match="train.model="):  # `wharf train`: before convert runs for it
        train_round(cfg_of(f"runs_dir={tmp_path}", f"engine.model={a}", f"train.model={b}"), progress=False)
    assert not (tmp_path / "default").exists()


def test_the_loop_stops_before_round_0s_collect_in_one_line(models, served_a, tmp_path, capsys):
    a, b = models
    _, url = served_a
    common = [f"runs_dir={tmp_path}", "name=r", "endpoint.launch=false", f"endpoint.url={url}", "endpoint.model=m"]
    # the served model, known from the config only live: vLLM's served name `m`
    assert loop_main([*common, "endpoint.kind=vllm", f"train.model={b}"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"from '{a}'" in err and f"train.model='{b}'" in err, err
    # a mismatch the config shows stops before the endpoint is even asked
    assert loop_main([*common, "engine.served_name=m", f"engine.model={a}", f"train.model={b}"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the local engine serves engine.model=" in err, err
    assert not (tmp_path / "r" / "rounds").exists()


def test_the_live_check_compares_the_root_then_the_tokens(models, served_a):
    a, b = models
    engine, url = served_a
    cfg = cfg_of("endpoint.kind=vllm", "endpoint.model=m")
    ep = Endpoint(url, model="m")
    check_served(ep, cfg, model_ref(str(a), "train.model"))  # the served model itself passes
    with pytest.raises(EndpointError) as e:
        check_served(ep, cfg, model_ref(str(b), "train.model"))
    assert f"serves 'm' from '{a}'" in one_line(e) and f"train.model='{b}'" in str(e.value)
    # a server on another machine reports a path this one cannot look up: matched by its name
    # (both dirs are `tiny`), the tokens then tell the two models apart
    engine.cfg = dataclasses.replace(engine.cfg, model="/elsewhere/tiny")
    try:
        with pytest.raises(EndpointError) as e:
            check_served(ep, cfg, model_ref(str(b), "train.model"))
        assert "tokenizes the probe chat into" in one_line(e) and f"train.model='{b}'" in str(e.value)
        check_served(ep, cfg, model_ref(str(a), "train.model"))
    finally:
        engine.cfg = dataclasses.replace(engine.cfg, model=str(a))
    with pytest.raises(EndpointError, match=r"does not serve endpoint.model='other'"):
        check_served(Endpoint(url, model="other"), cfg_of("endpoint.model=other"), model_ref(str(a), "train.model"))


def fake_hub_cache(cache, repo_id: str, model_dir) -> None:
    """`model_dir`'s files as huggingface_hub caches a download: blobs by hash, a snapshot of
    symlinks to them, refs/main naming the snapshot."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    snap = repo / "snapshots" / REV
    snap.mkdir(parents=True)
    for f in model_dir.iterdir():
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))


def test_a_hub_id_resolves_from_the_local_cache_and_one_not_there_says_how(models, tmp_path, monkeypatch):
    a, _ = models
    cache = tmp_path / "hub"
    fake_hub_cache(cache, "tinyorg/tiny-qwen", a)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    snap = cache / "models--tinyorg--tiny-qwen" / "snapshots" / REV
    assert resolve_model_dir("tinyorg/tiny-qwen", "train.model") == snap
    ref = trained_model(cfg_of("endpoint.kind=vllm", "endpoint.model=tinyorg/tiny-qwen"))
    assert ref.path == snap and ref.given == "tinyorg/tiny-qwen"
    engine = Engine(EngineConfig(model="tinyorg/tiny-qwen", served_name="m", device="cpu", threads=2))
    with AppThread(lambda: make_app(engine), name="engine-hub") as app:  # root: the hub id, as vLLM reports it
        assert Endpoint(app.url).roots()["m"] == "tinyorg/tiny-qwen"
        check_served(Endpoint(app.url, model="m"), cfg_of("endpoint.kind=vllm", "endpoint.model=m"),
                     model_ref("tinyorg/tiny-qwen", "train.model"))
    with pytest.raises(ModelError) as e:
        resolve_model_dir("tinyorg/absent", "train.model")
    assert "train.model='tinyorg/absent'" in one_line(e) and "huggingface-cli download tinyorg/absent" in str(e.value)


def test_hf_hub_offline_is_for_wharf_only_not_for_a_vllm_it_starts(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv(envdefaults.DEFAULTED, raising=False)
    envdefaults.apply()
    assert os.environ["HF_HUB_OFFLINE"] == "1" and envdefaults.child_env()["HF_HUB_OFFLINE"] == "1"
    assert "HF_HUB_OFFLINE" not in envdefaults.server_env()
    # a fake `vllm` that writes down the environment it was started with
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nenv > {tmp_path / 'env'}\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    cfg = cfg_of(f"endpoint.url=http://127.0.0.1:{free_port()}", "endpoint.kind=vllm", "endpoint.model=org/m")
    with pytest.raises(EndpointError, match="exited with code 3"):
        with launch(cfg, log_dir=tmp_path):
            pass
    env = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    assert "HF_HUB_OFFLINE" not in env and env["VLLM_API_KEY"] and env["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the person's own setting is theirs to keep
    monkeypatch.delenv(envdefaults.DEFAULTED)
    envdefaults.apply()
    assert envdefaults.server_env()["HF_HUB_OFFLINE"] == "1"
