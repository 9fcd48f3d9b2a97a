"""Gemini's tools, toolConfig and generationConfig as chat fields (the request side of gemini.py).

functionDeclarations become chat functions: `parametersJsonSchema` is JSON Schema already, the older
`parameters` (Gemini's OpenAPI-style Schema: upper-case types, `nullable`, `propertyOrdering`) is
rewritten as JSON Schema. Tools the upstream cannot run (googleSearch, codeExecution, urlContext,
...) are dropped and counted in the row's notes, as the other dialects do with hosted tools.
"""
from __future__ import annotations

from wharf.collect.proxy.dialects import DialectError, is_int


def camel_keys(d):
    """An object's own keys in lowerCamelCase. Google's JSON parser takes a field under its proto
    name too (the Python SDK sends `parameters_json_schema`); values are left alone (args, schemas'
    property names)."""
    if not isinstance(d, dict):
        return d
    return {(k.split("_")[0] + "".join(w[:1].upper() + w[1:] for w in k.split("_")[1:]) if "_" in k else k): v
            for k, v in d.items()}

# Schema keys whose value is one sub-schema, or a list / map of them.
_ONE = ("items", "additionalProperties")
_MANY = ("anyOf",)
_MAP = ("properties", "defs", "$defs")


def json_schema(s, where: str):
    """A Gemini Schema as JSON Schema: types lower-cased, `nullable` as a null type, no propertyOrdering."""
    if not isinstance(s, dict):
        return s  # additionalProperties: true/false
    out = {}
    for k, v in camel_keys(s).items():
        if k == "propertyOrdering":
            continue  # only orders Gemini's own output
        if k == "type" and isinstance(v, str):
            out[k] = v.lower()
        elif k in _ONE:
            out[k] = json_schema(v, f"{where}.{k}")
        elif k in _MANY and isinstance(v, list):
            out[k] = [json_schema(x, f"{where}.{k}[{i}]") for i, x in enumerate(v)]
        elif k in _MAP and isinstance(v, dict):
            out["$defs" if k == "defs" else k] = {n: json_schema(x, f"{where}.{k}.{n}") for n, x in v.items()}
        elif k == "ref":
            out["$ref"] = v
        else:
            out[k] = v
    if out.pop("nullable", False) is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _function(d, where: str) -> dict:
    d = camel_keys(d)
    if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not d["name"]:
        raise DialectError(f"{where}: a function declaration needs a 'name' string")
    if d.get("parametersJsonSchema") is not None:
        params = d["parametersJsonSchema"]
    elif d.get("parameters") is not None:
        params = json_schema(d["parameters"], f"{where}.parameters")
    else:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise DialectError(f"{where}.parameters: expected a schema object")
    fn = {"name": d["name"], "parameters": params}
    if d.get("description"):
        fn["description"] = d["description"]
    return {"type": "function", "function": fn}


def chat_tools(tools, dropped: list) -> list[dict]:
    """Every functionDeclaration of every Tool as a chat function; other tool kinds go to `dropped`."""
    if not isinstance(tools, list):
        raise DialectError("'tools' must be a list of Tool objects")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise DialectError(f"tools[{i}]: expected an object")
        for kind, val in camel_keys(t).items():
            if kind != "functionDeclarations":
                dropped.append(kind)
                continue
            if not isinstance(val, list):
                raise DialectError(f"tools[{i}].functionDeclarations: expected a list")
            out += [_function(d, f"tools[{i}].functionDeclarations[{j}]") for j, d in enumerate(val)]
    return out


def tool_choice(cfg) -> str | dict | None:
    """toolConfig.functionCallingConfig as chat's tool_choice (None: the default, auto)."""
    if not isinstance(cfg, dict):
        raise DialectError("'toolConfig' must be an object")
    fcc = camel_keys(camel_keys(cfg).get("functionCallingConfig"))
    if fcc is None:
        return None
    if not isinstance(fcc, dict):
        raise DialectError("toolConfig.functionCallingConfig: expected an object")
    mode = fcc.get("mode") or "AUTO"
    names = fcc.get("allowedFunctionNames") or []
    if mode in ("AUTO", "VALIDATED", "MODE_UNSPECIFIED"):
        return "auto"
    if mode == "NONE":
        return "none"
    if mode == "ANY":
        # One allowed name is a forced call; several cannot be said in chat: any function then.
        if isinstance(names, list) and len(names) == 1 and isinstance(names[0], str):
            return {"type": "function", "function": {"name": names[0]}}
        return "required"
    raise DialectError(f"toolConfig.functionCallingConfig.mode {mode!r}: expected AUTO, ANY, NONE or VALIDATED")


def _number(gc: dict, key: str) -> None:
    v = gc.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise DialectError(f"generationConfig.{key} must be a number")


# Gemini's knobs the proxy passes on under chat's names: forced_request then drops the ones the
# trainer cannot reproduce (top_k, the penalties) into the row's notes.
_RENAMED = {"topK": "top_k", "presencePenalty": "presence_penalty", "frequencyPenalty": "frequency_penalty",
            "seed": "seed"}


def generation(gc, chat: dict) -> None:
    """generationConfig into the chat body. temperature and topP are checked, not sent: the proxy
    forces the round's own."""
    if not isinstance(gc, dict):
        raise DialectError("'generationConfig' must be an object")
    gc = camel_keys(gc)
    n = gc.get("candidateCount")
    if n is not None and n != 1:
        raise DialectError(f"generationConfig.candidateCount={n!r}: the recording proxy gives one candidate per call")
    for key in ("temperature", "topP", "topK", "presencePenalty", "frequencyPenalty"):
        _number(gc, key)
    mot = gc.get("maxOutputTokens")
    if mot is not None:
        if not is_int(mot) or mot < 1:
            raise DialectError("generationConfig.maxOutputTokens must be a positive integer")
        chat["max_tokens"] = mot
    stops = gc.get("stopSequences")
    if stops:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise DialectError("generationConfig.stopSequences must be a list of strings")
        chat["stop"] = stops
    for k, chat_key in _RENAMED.items():
        if gc.get(k) is not None:
            chat[chat_key] = gc[k]
    _response_format(gc, chat)


def _response_format(gc: dict, chat: dict) -> None:
    mime = gc.get("responseMimeType")
    if mime in (None, "text/plain"):
        return
    if mime != "application/json":
        raise DialectError(f"generationConfig.responseMimeType {mime!r}: expected text/plain or application/json")
    if gc.get("responseJsonSchema") is not None:
        schema = gc["responseJsonSchema"]
    elif gc.get("responseSchema") is not None:
        schema = json_schema(gc["responseSchema"], "generationConfig.responseSchema")
    else:
        chat["response_format"] = {"type": "json_object"}
        return
    chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
