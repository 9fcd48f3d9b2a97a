"""The generic half of the run config: YAML files, `key=value` overrides, validation.

Validation is pydantic's, over the plain dataclasses of wharf/core/config.py: types, and ranges
written as `Annotated[int, Field(ge=1)]` on a field. Its errors are reworded to name the
file and the dotted key, and an unknown key gets the closest known one as a hint.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import ConfigDict, TypeAdapter, ValidationError

from wharf.core.config_redact import redacted
from wharf.core import bundled
from wharf.core.credentials import write_private
from wharf.core.errors import WharfError


class ConfigError(WharfError, ValueError):
    """A config file or override that does not fit the schema: bad input, exit 2 (also when a
    command finds it after parsing its arguments)."""

    exit_code = 2


class _Loader(yaml.SafeLoader):
    """YAML as users write it (YAML 1.2's scalars): `2e-4` is a float (PyYAML's 1.1 rules want
    `2.0e-4`)."""


# ... and only true/false are booleans: `mixed_precision=no` (accelerate's spelling) stays a string.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."))


def _yaml(text: str):
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: no arbitrary objects


_EXPECTED = {
    "int_type": "int", "int_parsing": "int", "int_from_float": "int",
    "float_type": "float", "float_parsing": "float", "string_type": "str", "bool_type": "bool",
    "bool_parsing": "bool", "list_type": "a list", "dict_type": "a mapping", "dataclass_type": "a mapping",
}


def _dataclasses(cls: type) -> list[type]:
    """`cls` and every dataclass reachable from its fields."""
    seen, todo = [], [cls]
    while todo:
        c = todo.pop()
        if c in seen or not dataclasses.is_dataclass(c):
            continue
        seen.append(c)
        for tp in typing.get_type_hints(c).values():
            todo.extend(typing.get_args(tp) or (tp,))
    return seen


def _adapter(cls: type) -> TypeAdapter:
    for c in _dataclasses(cls):
        if "__pydantic_config__" not in vars(c):
            c.__pydantic_config__ = ConfigDict(extra="forbid")
    return TypeAdapter(cls)


def _field_names(cls: type, loc: tuple) -> list[str]:
    """The keys known at `loc` (the dataclass that holds the last part of it)."""
    for part in loc:
        if not dataclasses.is_dataclass(cls):
            return []
        hints = typing.get_type_hints(cls)
        tp = hints.get(part)
        cls = next((a for a in (typing.get_args(tp) or (tp,)) if dataclasses.is_dataclass(a)), None)
    return [f.name for f in dataclasses.fields(cls)] if cls is not None and dataclasses.is_dataclass(cls) else []


def _explain(cls: type, err: dict) -> str:
    loc = tuple(p for p in err["loc"] if isinstance(p, int) or not str(p).startswith(("function-", "nullable")))
    where = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[")
    if err["type"] == "unexpected_keyword_argument":
        names = _field_names(cls, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), names, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(names)}"
        return f"unknown key '{where}'{hint}"
    value = err.get("input")
    if err["type"] == "literal_error":
        choices = re.findall(r"'([^']*)'", err.get("ctx", {}).get("expected", ""))
        return f"{where}: {value!r} is not one of {', '.join(choices)}"
    if err["type"] == "value_error" and isinstance(value, dict):  # a section's check across keys
        return str(err["ctx"]["error"])  # (__post_init__): its message names them
    if err["type"] in _EXPECTED:
        return f"{where}: expected {_EXPECTED[err['type']]}, got {value!r}"
    return f"{where}: {err['msg'].lower()} (got {value!r})"


def validate(cls: type, data: dict, source: str) -> Any:
    try:
        return _adapter(cls).validate_python(data)
    except ValidationError as e:
        problems = [_explain(cls, err) for err in e.errors()]
        raise ConfigError(f"{source}: " + "; ".join(problems)) from None


def deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_override(text: str) -> dict:
    """`collect.attempts=8` -> {"collect": {"attempts": 8}}; the value is read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}': expected key=value, e.g. collect.attempts=8")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override '{text}': empty key")
    try:
        value = _yaml(raw) if raw != "" else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override '{text}': value is not valid YAML ({_one_line(e)})") from None
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def _one_line(e: yaml.YAMLError) -> str:
    """PyYAML's message without its drawing of the line (a refusal is one line)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else problem


def read_yaml(path: str | Path) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as e:
        hint = f"; wharf carries {', '.join(bundled.carried_configs())} (--config NAME)" if not Path(path).exists() else ""
        raise ConfigError(f"{path}: cannot read config ({e.strerror}){hint}") from None
    try:
        data = _yaml(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {_one_line(e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def remove(data: dict, text: str) -> dict:
    """`~collect.agent_kwargs` (Hydra's removal): drop what the file set at that key, so that its
    default applies again, or a dict override starts empty (dict overrides merge)."""
    keys = text[1:].split(".")
    if not all(keys) or "=" in text:
        raise ConfigError(f"override '{text}': expected ~key, e.g. ~collect.agent_kwargs")
    out = dict(data)
    node = out
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            return out  # nothing set there: nothing to remove
        node[k] = dict(node[k])
        node = node[k]
    node.pop(keys[-1], None)
    return out


def load(cls: type, path: str | Path | None, overrides: typing.Sequence[str] = ()) -> Any:
    """Read `path` (None: defaults only), apply overrides in order (`key=value` merges, `~key`
    removes), and validate the result as `cls`."""
    path = bundled.config_path(path) if path is not None else None
    data = read_yaml(path) if path is not None else {}
    return load_data(cls, data, overrides, str(path) if path is not None else "defaults")


def load_data(cls: type, data: dict, overrides: typing.Sequence[str] = (), source: str = "config") -> Any:
    """`data` (what a YAML file holds) with `overrides` applied, validated as `cls`; errors name `source`."""
    for text in overrides:
        data = remove(data, text) if text.startswith("~") else deep_merge(data, parse_override(text))
    return validate(cls, data, source)


def dump(cfg: Any, path: str | Path) -> None:
    """Write `cfg` as YAML for the record, its secrets taken out (config_redact), owner-only."""
    write_private(path, yaml.safe_dump(redacted(cfg), sort_keys=False).encode())


def dump_whole(cfg: Any, path: str | Path) -> None:
    """Write `cfg` as YAML with its secrets, owner-only: only for a child process to read, never
    into a run dir (procs.stage_argv)."""
    write_private(path, yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False).encode())


def _allowed(tp) -> str:
    """`a | b` for a Literal, `>= 1`-style bounds for an Annotated range, '' otherwise."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Literal:
        return " | ".join(map(str, args))
    if typing.get_origin(tp) is typing.Annotated:
        ops = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
        bounds = []
        for meta in args[1:]:
            for m in getattr(meta, "metadata", [meta]):  # pydantic's Field keeps Ge, Le, ... here
                bounds += [f"{op} {getattr(m, k)}" for k, op in ops.items() if getattr(m, k, None) is not None]
        return ", ".join(bounds)
    return next((a for a in map(_allowed, args) if a), "")  # Optional[...]: the inner type's


def keys_help(cls: type, prefix: str = "", only: typing.Collection[str] | None = None) -> list[str]:
    """`key = default  (allowed values)` for every leaf key of `cls`, dotted: what `--help` shows
    and what docs/configuration.md's key list is generated from. `only`: the top-level keys
    (sections) to list; None lists all."""
    out = []
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        tp = hints[f.name]
        sub = next((a for a in (typing.get_args(tp) or (tp,)) if dataclasses.is_dataclass(a)), None)
        if sub is not None:
            out += keys_help(sub, f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "required")
        allowed = _allowed(tp)
        out.append(f"  {prefix}{f.name} = {default!r}" + (f"  ({allowed})" if allowed else ""))
    return out


def parser(prog: str, cls: type, description: str = "", sections: typing.Collection[str] | None = None):
    """The argparse parser of every config-taking command: `--config FILE key=value ...`, and a
    `--help` that lists the keys it reads (`sections`: its top-level keys; None: every key) with
    their defaults. Every key of the file is still checked: one file configures a whole run."""
    import argparse

    from wharf.core.entry import ArgParser

    which = "config keys" if sections is None else \
        f"the config keys {prog} reads (the run config holds more: `wharf loop --help` lists every key)"
    p = ArgParser(prog=prog, description=description or None, formatter_class=argparse.RawDescriptionHelpFormatter,
                  epilog=f"{which} (key = default; set in the YAML file or as key=value):\n"
                         + "\n".join(keys_help(cls, only=sections)))
    p.add_argument("--config", default=None, help="YAML config file (default: built-in defaults)")
    p.add_argument("overrides", nargs="*",
                   help="key=value overrides, e.g. collect.attempts=8; ~key drops what the file set there")
    return p


def from_args(args, prog: str, cls: type, extra: typing.Sequence[str] = (), paths: bool = True) -> Any:
    """The config `args` (from parser()) name; a bad one is one line on stderr and exit 2.
    `paths`: also check the config's paths (`check_paths()`), for a command that writes there."""
    import sys

    from wharf.core.log import setup_logging

    setup_logging()  # before the load: what it says (an old class name, a carried path) reaches the console
    try:
        cfg = load(cls, args.config, [*extra, *args.overrides])
        check = getattr(cfg, "check_paths", None) if paths else None
        if check is not None:
            check()  # what validation cannot see: a path the config names that is a file, not a directory
        return cfg
    except ConfigError as e:
        print(f"{prog}: bad config: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def cli(argv: list[str] | None, prog: str, cls: type, description: str = "",
        sections: typing.Collection[str] | None = None) -> Any:
    """`--config FILE key=value ...` as every stage's entry point takes it; exits 2 on a bad config."""
    return from_args(parser(prog, cls, description, sections).parse_args(argv), prog, cls,
                     paths=sections is None or "runs_dir" in sections)
