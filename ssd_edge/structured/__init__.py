"""Structured output: answers held to a JSON schema, a regex, a grammar or a tool call (llguidance).

constraint.py   what an answer must look like, and its grammar (compile, ConstraintError)
tokenizer.py    llguidance's tokenizer of a model's vocabulary, built once per loaded model
shaping.py      a row's shaping before its draw: logit bias, penalties, the grammar's mask, the infill sampler
infill_filter.py  llama.cpp's infill sampler (editors' /infill requests name it), as a row's last shaping
rows.py         the target's rows under a constraint (the row hook, logprobs), the draft's, the forced runs
                (the grammar's only continuation, proposed first in a round: drafts that cost no model)
template.py     a GGUF's Jinja chat template, rendered as Hugging Face does (prompts with tools)
tools.py        OpenAI tools and tool_choice: the prompt and the grammar of a call
calls.py        tool calls read out of an answer's text, streamed or whole
request.py      OpenAI's response_format / tools / tool_choice as a Shape: the constraint, the prompt's tools
"""

from .constraint import Compiled, Constraint, ConstraintError, Grammar, JsonObject, JsonSchema, Regex, compile, parse_schema
from .calls import Tools

__all__ = ["Compiled", "Constraint", "ConstraintError", "Grammar", "JsonObject", "JsonSchema", "Regex", "Tools",
           "compile", "parse_schema"]
