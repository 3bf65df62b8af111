"""`ssd-edge generate --json-schema` as a user runs it, on the small real pair (SmolLM2-135M + its first 28
blocks): the answer is JSON that fits the schema, and it ends at the grammar's end (the model's end token),
not at -n. The flags' parsing and errors: tests/faces/test_cli_structured.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli_real import clean_env, pair_args

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                           "population": {"type": "integer", "minimum": 0}},
          "required": ["city", "population"], "additionalProperties": False}


def test_generate_json_schema_prints_json_that_fits(small_pair, tmp_path):
    schema = tmp_path / "city.json"
    schema.write_text(json.dumps(SCHEMA))
    # -m ssd_edge.cli.commands from the repository root: the tree under test, whatever is installed
    p = subprocess.run([sys.executable, "-m", "ssd_edge.cli.commands", "generate", "--chat", "--json", "-q",
                        "--json-schema", str(schema), *pair_args(small_pair), "-n", "64", "--mode", "sd",
                        "What is the largest city of France, and how many people live there?"],
                       capture_output=True, timeout=300, env=clean_env(), cwd=ROOT)
    assert p.returncode == 0, p.stderr.decode()
    data = json.loads(p.stdout)
    answer = json.loads(data["text"])
    assert data["stop_reason"] == "eos", data  # the grammar completed the object: the model's end token
    assert set(answer) == {"city", "population"}
    assert isinstance(answer["city"], str) and len(answer["city"]) <= 24
    assert isinstance(answer["population"], int) and answer["population"] >= 0
    assert data["text"] == json.dumps(answer, ensure_ascii=False)  # rigid separators: ", " and ": "
