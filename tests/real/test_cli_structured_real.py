"""`ssd-edge generate --json-schema` as a user runs it, on the small pair's target (SmolLM2-135M, mode
lookup, where the grammar's forced runs are drafts): the answer is JSON that fits the schema (its integer
bounded: this small model would write digits up to -n), and it ends at the grammar's end (the model's end
token), not at -n. Every mode under a grammar: tests/engine/test_structured_engine.py; the flags' parsing
and errors: tests/faces/test_cli_structured.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli_real import clean_env

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                           "population": {"type": "integer", "minimum": 0, "maximum": 99999999}},
          "required": ["city", "population"], "additionalProperties": False}


def test_generate_json_schema_prints_json_that_fits(small_pair, tmp_path):
    schema = tmp_path / "city.json"
    schema.write_text(json.dumps(SCHEMA))
    # -m ssd_edge.cli.commands from the repository root: the tree under test, whatever is installed
    p = subprocess.run([sys.executable, "-m", "ssd_edge.cli.commands", "generate", "--chat", "--json", "-q",
                        "--json-schema", str(schema), "--logprobs", "1", "-m", str(small_pair[0]), "--no-draft", "-c", "512", "-n", "64",
                        "--mode", "lookup",
                        "What is the largest city of France, and how many people live there?"],
                       capture_output=True, timeout=300, env=clean_env(), cwd=ROOT)
    assert p.returncode == 0, p.stderr.decode()
    data = json.loads(p.stdout)
    answer = json.loads(data["text"])
    assert data["stop_reason"] == "eos", data  # the grammar completed the object: the model's end token
    assert set(answer) == {"city", "population"}
    assert isinstance(answer["city"], str) and len(answer["city"]) <= 24
    assert isinstance(answer["population"], int) and 0 <= answer["population"] <= 99999999
    assert [lp["id"] for lp in data["logprobs"]] == data["tokens"]  # one a token, with 1 alternative
    assert all(len(lp["top_logprobs"]) == 1 and lp["logprob"] <= 0 for lp in data["logprobs"])
    assert data["stats"]["forced"] > 0  # '{"city": "' is the grammar's alone: drafted without a model
    assert data["text"] == json.dumps(answer, ensure_ascii=False)  # rigid separators: ", " and ": "
