"""The engine's tool-call parsers (wharf/engine/tool_parsers.py) on text in each format as the
models write it, the answers vLLM's parsers of the same names give (their documented formats and
the outputs of vLLM's tests/entrypoints/openai/tool_parsers/ test cases, restated here), what
stays content, what a stream holds back, and which parser the engine picks."""
from __future__ import annotations

import json
import typing

import pytest

from wharf.core.config import ConfigError, EngineConfig, load_config
from wharf.core.families import FAMILIES
from wharf.engine import tool_parsers as tp


def calls_of(parsed) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed[1]]


def test_hermes_blocks_after_text():
    # Qwen2.5 / Hermes 2 Pro: one <tool_call> block of {"name", "arguments"} per call.
    text = ('Let me check.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call>')
    parsed = tp.parse_hermes(text)
    assert parsed[0] == "Let me check."
    assert calls_of(parsed) == [("bash", {"command": "ls"}), ("read", {"path": "a.py"})]
    assert parsed[1][0]["id"].startswith("chatcmpl-tool-") and parsed[1][0]["type"] == "function"


def test_llama3_json_parameters_or_arguments_python_tag_and_semicolons():
    # Llama 3.1's JSON calls ({"name", "parameters"}), after <|python_tag|> where the text keeps
    # it, several separated by "; "; vLLM returns content None and reads any depth.
    text = ('<|python_tag|>{"name": "searchTool", "parameters": {"query": "test {value}; [x]", "limit": 10}}; '
            '{"name": "getOpenIncidentsTool", "arguments": {}}; '
            '{"name": "complexTool", "parameters": {"config": {"db": {"pool": {"size": 10}}}}}')
    parsed = tp.parse_llama3_json(text)
    assert parsed[0] is None
    assert calls_of(parsed) == [("searchTool", {"query": "test {value}; [x]", "limit": 10}),
                                ("getOpenIncidentsTool", {}),
                                ("complexTool", {"config": {"db": {"pool": {"size": 10}}}})]
    assert parsed[1][1]["function"]["arguments"] == "{}"
    # text around the object is dropped, as vLLM does
    assert calls_of(tp.parse_llama3_json('Here is the result: {"name": "getOpenIncidentsTool", "parameters": {}} '
                                         'Would you like to know more?')) == [("getOpenIncidentsTool", {})]


def test_mistral_list_after_the_marker():
    # Mistral 7B Instruct v0.3 (tokenizer v3): [TOOL_CALLS] then a JSON list of {name, arguments};
    # the text before the marker is the content, ids are 9 letters or digits.
    text = ('Checking.[TOOL_CALLS] [{"name": "bash", "arguments": {"command": "ls"}}, '
            '{"name": "get_current_weather", "arguments": {"city": "Dallas", "unit": "fahrenheit"}}]')
    parsed = tp.parse_mistral(text)
    assert parsed[0] == "Checking."
    assert calls_of(parsed) == [("bash", {"command": "ls"}),
                                ("get_current_weather", {"city": "Dallas", "unit": "fahrenheit"})]
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in parsed[1])
    assert tp.parse_mistral('[TOOL_CALLS] [{"name": "bash", "arguments": {"command": "ls"}}]')[0] is None


def test_mistral_v11_name_then_arguments():
    # Tokenizers v11 on (Mistral Small 3.1, Devstral): [TOOL_CALLS]name[ARGS]{json} per call,
    # [ARGS] in the text where special tokens are kept, absent in the older v11 form.
    text = 'Sure.[TOOL_CALLS]bash[ARGS]{"command": "ls -la"}[TOOL_CALLS]add{"a": 3.5, "b": 4}'
    parsed = tp.parse_mistral_v11(text)
    assert parsed[0] == "Sure."
    assert calls_of(parsed) == [("bash", {"command": "ls -la"}), ("add", {"a": 3.5, "b": 4})]


def test_pythonic_calls_with_literal_arguments():
    # Llama 3.2 / Gemma 3 with vLLM's pythonic template: a Python list of calls with keyword
    # arguments; read with ast, never run.
    text = ("[get_weather(city='San Francisco', metric='celsius'), "
            "register_user(name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, role=None, "
            "passed_test=True, aliases=['John', 'Johnny'], offset=-2), get_time()]")
    parsed = tp.parse_pythonic(text)
    assert parsed[0] is None
    assert calls_of(parsed) == [
        ("get_weather", {"city": "San Francisco", "metric": "celsius"}),
        ("register_user", {"name": "John Doe", "age": 37, "address": {"city": "San Francisco", "state": "CA"},
                           "role": None, "passed_test": True, "aliases": ["John", "Johnny"], "offset": -2}),
        ("get_time", {})]
    assert parsed[1][1]["function"]["arguments"].startswith('{"name": "John Doe", "age": 37')
    assert calls_of(tp.parse_pythonic(r"[get_weather(city='Martha\'s Vineyard')]")) == [
        ("get_weather", {"city": "Martha's Vineyard"})]


UNPARSABLE = [
    (tp.parse_hermes, '<tool_call>{"name": "bash", "arguments": {not json}}</tool_call>'),
    (tp.parse_hermes, '<tool_call>{"arguments": {}}</tool_call>'),
    (tp.parse_llama3_json, '{"name": "invalidTool", "parameters": {invalid json}'),
    (tp.parse_llama3_json, '{"name": "bash"}'),  # neither arguments nor parameters
    (tp.parse_llama3_json, '{"name": "bash", "parameters": {}} and then {oops}'),
    (tp.parse_llama3_json, '{"tool": "bash", "parameters": {}}'),
    (tp.parse_mistral, '[TOOL_CALLS] [{"name": "bash", "arguments": {"command": "ls"}'),  # cut short
    (tp.parse_mistral, '[TOOL_CALLS] {"name": "bash", "arguments": {}}'),  # not a list
    (tp.parse_mistral, '[TOOL_CALLS] [{"name": "a", "arguments": {}}][TOOL_CALLS] [{"name": "b", "arguments": {}}]'),
    (tp.parse_mistral_v11, "[TOOL_CALLS]bash"),  # no arguments yet
    (tp.parse_pythonic, "I will call [get_weather(city='Paris')]"),  # calls only at the start
    (tp.parse_pythonic, "[os.system(command='ls')]"),  # a dotted name
    (tp.parse_pythonic, "[get_weather('Paris')]"),  # a positional argument
    (tp.parse_pythonic, "[get_weather(city=open('/etc/passwd').read())]"),  # not a literal: never run
    (tp.parse_pythonic, "[get_weather(**{'city': 'Paris'})]"),
    (tp.parse_pythonic, "[1, 2]"),
    (tp.parse_pythonic, "[get_weather(city='Paris'"),  # cut short
]


@pytest.mark.parametrize("parse,text", UNPARSABLE, ids=[f"{p.__name__}-{i}" for i, (p, _) in enumerate(UNPARSABLE)])
def test_what_does_not_parse_stays_content_whole(parse, text):
    assert parse(text) == (text, [])


@pytest.mark.parametrize("parser", [tp.HERMES, tp.LLAMA3_JSON, tp.MISTRAL, tp.MISTRAL_V11, tp.PYTHONIC])
def test_plain_text_is_content(parser):
    assert parser.parse("The tests pass now.") == ("The tests pass now.", [])


@pytest.mark.parametrize("parser,text,final,held", [
    (tp.HERMES, "Let me look.\n<tool_call>\n{", False, "<tool_call>\n{"),
    (tp.HERMES, "Let me look.\n<tool_", False, "<tool_"),  # may still become the marker
    (tp.HERMES, "Let me look.\n<tool_", True, ""),  # the answer ended: it did not
    (tp.LLAMA3_JSON, '{"name": "ba', False, '{"name": "ba'),
    (tp.LLAMA3_JSON, "Sure <|python", False, "<|python"),
    (tp.MISTRAL, "Checking.[TOOL_CALLS] [{", False, "[TOOL_CALLS] [{"),
    (tp.MISTRAL, "Checking.[TOOL_", False, "[TOOL_"),
    (tp.PYTHONIC, "[get_weather(city=", False, "[get_weather(city="),
    (tp.PYTHONIC, "See [1]", False, ""),  # a call counts only at the start
])
def test_a_stream_holds_back_what_may_start_a_call(parser, text, final, held):
    assert text[parser.hold_from(text, final):] == held


def test_auto_picks_the_familys_format_where_the_template_renders_tools():
    by_name = {f.name: f.tool_parser for f in FAMILIES}
    assert by_name == {"Llama": "llama3_json", "Mistral": "mistral", "Qwen2.5": "hermes", "Qwen3": "hermes",
                       "Gemma 3": "pythonic", "Gemma 2": "pythonic"}
    assert tp.pick("auto", "llama3_json", True, {})[0] is tp.LLAMA3_JSON
    assert tp.pick("auto", "mistral", True, {"[TOOL_CALLS]": 5})[0] is tp.MISTRAL
    assert tp.pick("auto", "mistral", True, {"[TOOL_CALLS]": 5, "[ARGS]": 6})[0] is tp.MISTRAL_V11
    assert tp.pick("auto", None, True, {})[0] is tp.HERMES  # a model type the table does not list
    # SmolLM2 (a Llama) and Gemma's templates have no tools: wharf writes its hermes block, so hermes.
    assert tp.pick("auto", "llama3_json", False, {})[0] is tp.HERMES
    assert tp.pick("auto", "pythonic", False, {})[0] is tp.HERMES
    assert tp.pick("pythonic", "llama3_json", False, {}) == (tp.PYTHONIC, "engine.tool_parser")


def test_the_config_key_offers_exactly_the_registry():
    choices = typing.get_args(typing.get_type_hints(EngineConfig)["tool_parser"])
    assert set(choices) == {"auto", *tp.PARSERS}
    assert {f.tool_parser for f in FAMILIES} <= set(tp.PARSERS)


def test_a_bad_override_is_one_line_naming_the_key_and_the_choices():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["engine.tool_parser=llama3"])
    assert str(e.value).count("\n") == 0
    assert "engine.tool_parser" in str(e.value) and "auto, hermes, llama3_json, mistral, pythonic" in str(e.value)
    with pytest.raises(ValueError, match=r"engine.tool_parser='llama3': choose one of auto, hermes, llama3_json"):
        tp.pick("llama3", None, True, {})
