"""The GGUF's Jinja chat template rendered by structured/template.py, byte for byte, on the default
Qwen2.5-coder GGUFs (1.5B and 0.5B: their templates differ in one literal, doubled braces in the
tool instructions of the 1.5B's).

- Plain role/text messages with a system message: the Jinja rendering equals llama.cpp's own
  renderer (Model.render_chat). Without one the template adds Qwen's default system turn and
  llama.cpp's chatml does not: that is why plain chats keep llama.cpp's renderer.
- Messages with tools, an assistant's tool call (OpenAI's string arguments) and two tool results:
  the expected prompt is written out by hand from the template's text.
- Pair.render_chat takes that path when tools are given, and the prompt's `<tool_call>` tags read as
  the special token.
"""

from __future__ import annotations

import pytest

from ssd_edge.llama.model import Model
from ssd_edge.structured.template import ChatTemplate

pytestmark = pytest.mark.default_pair

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather <now> & \"here\", é",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "user", "content": "Thanks"},
]

# written from the template's text: the tools in the system turn (one tojson each, no HTML escaping),
# the call with its arguments as an object, consecutive tool results in one user turn
EXPECTED = (
    "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
    "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & \\"here\\", é", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{BRACE\"name\": <function-name>, \"arguments\": <args-json-object>}BRACE\n</tool_call><|im_end|>\n"
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\nsunny\n"
    "</tool_response><|im_end|>\n"
    "<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n"
)

DEFAULT_SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"


@pytest.fixture(scope="module", params=["target", "draft"])
def qwen(request, default_pair):
    """(model, its template, the brace literal its tool instructions hold): the 1.5B doubles it."""
    path = default_pair[0 if request.param == "target" else 1]
    model = Model(path)
    yield model, ChatTemplate(model.chat_template(), *model.bos_eos_text()), "{" if "1.5b" in path.name else ""
    model.close()


def test_plain_messages_render_as_llama_cpps_renderer(qwen):
    model, template, _ = qwen
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <b> & \"you\" é"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again"}]
    assert template.render(chat) == model.render_chat(chat)
    assert template.render(chat[1:]) == DEFAULT_SYSTEM + model.render_chat(chat[1:])
    assert template.render(chat, add_generation_prompt=False) == model.render_chat(chat, add_assistant=False)


def test_tools_calls_and_results_render_as_the_template_writes_them(qwen):
    model, template, brace = qwen
    expected = EXPECTED.replace("{BRACE", "{" + brace).replace("}BRACE", "}" + brace.replace("{", "}"))
    assert template.render(HISTORY, TOOLS) == expected
    # arguments sent as an object render the same; without tools the system turn is the plain one
    as_object = [dict(m, tool_calls=[{"type": "function", "function": {"name": "get_weather",
                                                                        "arguments": {"city": "Paris"}}}])
                 if m.get("tool_calls") else m for m in HISTORY]
    assert template.render(as_object, TOOLS) == expected
    assert template.render(HISTORY).startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")


def test_the_pair_renders_tools_with_the_template(default_pair):
    from ssd_edge.config import EngineConfig
    from ssd_edge.pair import Pair

    with Pair(EngineConfig.build(target=dict(path=str(default_pair[1]), threads=1), n_ctx=512, mode="ar")) as pair:
        prompt = pair.render_chat(HISTORY, TOOLS)
        assert prompt == EXPECTED.replace("BRACE", "")
        assert pair.render_chat(HISTORY[:2]) == pair.target.render_chat(HISTORY[:2])  # plain: llama.cpp's
        tokens = pair.tokenize(prompt, parse_special=True)
        assert tokens.count(151657) == 3 and tokens.count(151658) == 3  # the instructions, and the call
