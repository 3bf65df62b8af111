"""The names that users and scripts read, pinned in tests/golden/fields.json: the fields of the typed
records (the events, Stats and its nested records, bench.json's schema), the keys at every level of the
JSON that the faces write (Stats.to_dict(), `generate --json`, bench.json, the server's responses), the
/metrics sample names with their label names, and the words those keys and labels take.

Everything is read from real code paths: an auto-mode generation on the fake pair (tests/fakes.py),
`write_completion` (generate --json), the OpenAI server on that engine through a TestClient, and a
quick `ssd-edge bench --priced` run, which needs no model files. Only names and nesting are kept, never
values: a dict's keys become dotted paths ("prespec.hits"), a list's elements add "[]"
("runs[].tokens"), and a map keyed by data rather than by field (rounds by proposer, verify_ms by
tokens) keeps "*" for its keys (MAPS); the words those data keys take are pinned under "vocabularies".

A change here breaks a reader. When it is meant, list each rename, removal or addition in
CHANGELOG.md and regenerate the golden file:

    python tests/unit/test_golden_fields.py --write
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import sys
import tempfile
import typing
from functools import cache
from pathlib import Path
from typing import Any, Iterator, Mapping
from unittest import mock

TESTS = Path(__file__).resolve().parents[1]
for _folder in (TESTS, TESTS.parent):  # run as a script (--write): this checkout's ssd_edge and tests/, as pytest has
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from fakes import FakeContext, FakeModel  # noqa: E402
from ssd_edge import config, events, metrics  # noqa: E402
from ssd_edge.bench import schema  # noqa: E402
from ssd_edge.config import EngineConfig  # noqa: E402
from ssd_edge.engine import Engine  # noqa: E402
from ssd_edge.events import FinishEvent, TokenEvent  # noqa: E402
from ssd_edge.server import reply  # noqa: E402

GOLDEN = TESTS / "golden" / "fields.json"
WRITE = "python tests/unit/test_golden_fields.py --write"
PROMPT = [3, 9, 4, 17, 2]

# Maps keyed by data (a proposer, a token count, a setting's name), not by field: their keys read as "*".
MAPS = {
    "Stats.to_dict()": {"speculators", "prespec.miss_reasons", "prespec.hits_by_accepted", "devices", "auto.decisions",
                        "auto.verify_ms", "host_by_worker"},
    "bench.json": {"libraries", "engine_configs", "runs[].miss_reasons", "runs[].hits_by_accepted", "runs[].modes_run",
                   "runs[].auto.decisions", "runs[].auto.verify_ms", "runs[].host_by_worker",
                   "summary[].host_ms_per_position_by_worker"},
    "server": {"speculation.rounds_by_proposer", "speculation.tokens_by_source", "speculation.planner_decisions",
               "choices[].logprobs.top_logprobs[]"},  # /v1/completions' {token text: logprob}
}
MAPS["generate --json"] = {f"stats.{p}" for p in MAPS["Stats.to_dict()"]}


def shape(obj: Any, maps: set[str], path: str = "") -> set[str]:
    """Every key path in obj, intermediate ones included: {"a": {"b": [{"c": 1}]}} ->
    {"a", "a.b", "a.b[]", "a.b[].c"}. A map named in `maps` gives "path.*" (even when empty)."""
    out: set[str] = set()
    if isinstance(obj, Mapping):
        if path in maps:
            out.add(f"{path}.*")
        for key, value in obj.items():
            sub = f"{path}.*" if path in maps else f"{path}.{key}" if path else str(key)
            out.add(sub)
            out |= shape(value, maps, sub)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            out.add(f"{path}[]")
            out |= shape(item, maps, f"{path}[]")
    return out


# ---------------------------------------------------------------- the sections, each from its code path

EVENT_RECORDS = ("Round", "LiveStats", "TokenEvent", "PrespecStats", "AutoStats", "Stats", "FinishEvent")


def records() -> dict[str, list[str]]:
    """Fields in declaration order (the order of positional construction and of to_dict()), then the
    public properties; for the events' dataclasses and every pydantic model of bench.json's schema."""
    out = {}
    for name in EVENT_RECORDS:
        cls = getattr(events, name)
        props = [f"{p} (property)" for p, v in vars(cls).items() if isinstance(v, property) and not p.startswith("_")]
        out[name] = [f.name for f in dataclasses.fields(cls)] + props
    for name, cls in vars(schema).items():
        if isinstance(cls, type) and issubclass(cls, schema.BaseModel) and cls is not schema.BaseModel:
            out[f"bench.schema.{name}"] = list(cls.model_fields)
    return out


def vocabularies() -> dict[str, list[str]]:
    """The words that the data-keyed maps and the metrics' labels take."""
    return {
        "Provenance (tokens_by_source, completion_tokens{source})": list(typing.get_args(events.Provenance)),
        "Speculator (Stats.speculators)": list(typing.get_args(events.Speculator)),
        "SPECULATOR_MODE (Round.mode, modes_run)": [f"{k}: {v}" for k, v in events.SPECULATOR_MODE.items()],
        "PrespecOutcome (Round.prespec, prespec_lookups{outcome})": list(typing.get_args(events.PrespecOutcome)),
        "StopReason (stop_reason, generations{reason})": list(typing.get_args(events.StopReason)),
        "Health (prespec.health, hit_rate_health)": list(typing.get_args(events.Health)),
        "MISS_REASONS (miss_reasons)": list(events.MISS_REASONS),
        "WORKER_BESIDE (host_by_worker, host_ms_per_position_by_worker)": list(metrics.WORKER_BESIDE),
        "MODES (mode)": list(config.MODES),
        "PROPOSER (rounds_by_proposer, rounds{proposer})": [f"{k}: {v}" for k, v in reply.PROPOSER.items()],
        "FINISH_REASON (finish_reason)": [f"{k}: {v}" for k, v in reply.FINISH_REASON.items()],
    }


@contextlib.contextmanager
def two_cores() -> Iterator[None]:
    """This project's machine, so the planner decides alike everywhere (as tests/engine/test_auto.py)."""
    with mock.patch("ssd_edge.planning.rounds.usable_cores", lambda: 2):
        yield


def fake_engine(threads: int = 2, target_s: float = 0.0, draft_s: float = 0.0) -> Engine:
    """The fake pair in mode auto (`threads` each; a decode of the target waits `target_s`, one of the
    draft `draft_s`), with devices as a loaded GGUF pair reports them (fake models have no metadata, so
    Engine.devices() would be None, and Stats.devices and /metrics' model_device empty)."""
    cfg = EngineConfig.build(target=dict(path="fake-target", threads=threads),
                             draft=dict(path="fake-draft", threads=threads), n_ctx=1024, mode="auto", spec=dict(k=3))
    target, draft = FakeModel("target"), FakeModel("draft", disagree_every=3)
    eng = Engine.from_parts(cfg, target, FakeContext(target, n_ctx=1024, decode_delay=target_s), draft,
                            FakeContext(draft, n_ctx=2048, n_seq_max=cfg.prespec.fanout_max + 1, decode_delay=draft_s))
    eng.devices = lambda: {"target": "CPU", "draft": "CPU"}
    return eng


def generation() -> dict[str, list[str]]:
    """Stats.to_dict() of an auto generation (the superset: "auto" is there in mode auto only), and the
    events it came in, checked to be the records pinned above."""
    with two_cores(), fake_engine() as eng:
        evs = list(eng.generate(tokens=PROMPT, max_tokens=24))
    token, finish = evs[0], evs[-1]
    assert isinstance(token, TokenEvent) and isinstance(finish, FinishEvent)
    assert type(token.round) is events.Round and type(token.live) is events.LiveStats
    assert finish.stats.auto is not None and finish.stats.devices is not None
    return {"Stats.to_dict()": sorted(shape(finish.stats.to_dict(), MAPS["Stats.to_dict()"]))}


def generate_json() -> dict[str, list[str]]:
    """The one object of `ssd-edge generate --json`."""
    from ssd_edge.cli.generation import write_completion

    out = io.StringIO()
    with two_cores(), fake_engine() as eng, contextlib.redirect_stdout(out):
        code = write_completion(eng, eng.config, "count", None, 12, [], json_out=True, quiet=True)
    assert code == 0
    return {"generate --json": sorted(shape(json.loads(out.getvalue()), MAPS["generate --json"]))}


def server() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The server's JSON (whole and streamed answers, health, models, an error) and /metrics after them:
    {sample name: its label names}."""
    from prometheus_client.parser import text_string_to_metric_families
    from starlette.testclient import TestClient

    from ssd_edge.server import create_app

    chat = {"messages": [{"role": "user", "content": "count"}], "max_tokens": 12}
    text = {"prompt": "count", "max_tokens": 12, "mode": "ssd"}
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    bodies: dict[str, list[Any]] = {}
    # A verify slower than a drafted token and one thread each, so the SSD worker has rounds prepared for the
    # lookups (prespec_lookups{outcome}) on a loaded machine too, as in tests/faces/test_serve.py
    with two_cores(), fake_engine(threads=1, target_s=0.02, draft_s=0.001) as eng, \
            TestClient(create_app(eng, model_id="fake")) as client:
        def post(name: str, path: str, body: dict[str, Any]) -> None:
            r = client.post(path, json=body)
            assert r.status_code == 200, r.text
            if body.get("stream"):  # the stream's chunks: the data lines but the final [DONE]
                bodies[name] = [json.loads(line[5:]) for line in r.text.splitlines()
                                if line.startswith("data:") and line[5:].strip() != "[DONE]"]
            else:
                bodies[name] = [r.json()]

        post("POST /v1/chat/completions", "/v1/chat/completions", chat)
        post("POST /v1/chat/completions (stream chunks)", "/v1/chat/completions", {**chat, **usage})
        post("POST /v1/completions", "/v1/completions", text)
        post("POST /v1/completions (stream chunks)", "/v1/completions", {**text, **usage})
        logprobs = {"logprobs": True, "top_logprobs": 2}
        post("POST /v1/chat/completions (logprobs)", "/v1/chat/completions", {**chat, **logprobs})
        post("POST /v1/chat/completions (logprobs, stream chunks)", "/v1/chat/completions", {**chat, **logprobs,
                                                                                          **usage})
        post("POST /v1/completions (logprobs)", "/v1/completions", {**text, "logprobs": 2})
        for path in ("/health", "/v1/models", "/v1/models/fake"):
            bodies[f"GET {path}"] = [client.get(path).json()]
        bad = client.post("/v1/completions", json={**text, "n": 0})
        assert bad.status_code == 400
        bodies["an error (any 4xx/5xx)"] = [bad.json()]
        page = client.get("/metrics").text
    json_paths = {name: sorted(set().union(*(shape(b, MAPS["server"]) for b in bs))) for name, bs in bodies.items()}
    metrics: dict[str, list[str]] = {}
    for family in text_string_to_metric_families(page):
        assert family.samples, f"{family.name}: no sample after the requests, so its labels are not seen"
        for s in family.samples:
            metrics[s.name] = sorted(set(metrics.get(s.name, [])) | set(s.labels))
    return json_paths, metrics


def bench_json() -> dict[str, list[str]]:
    """bench.json of a quick priced run (synthetic models waiting an H200's prices: no files, no GPU) in
    modes auto and ssd: "auto" and "profile" are filled only where auto ran."""
    from typer.testing import CliRunner

    from ssd_edge.cli import commands as cli

    with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ, {"SSD_EDGE_HOME": f"{tmp}/home"}), \
            CliRunner().isolation() as (_, err, _):
        code = cli.run(["bench", "--priced", "h200-1.5b", "--quick", "--modes", "auto,ssd", "--category", "code",
                        "-n", "4", "--no-plot", "-o", f"{tmp}/out"])
        assert code == 0, err.getvalue().decode()
        data = json.loads(Path(tmp, "out", "bench.json").read_text())
    assert data["profile"] and any(run["auto"] for run in data["runs"])
    return {"bench.json": sorted(shape(data, MAPS["bench.json"]))}


@cache
def collect() -> dict[str, dict[str, list[str]]]:
    """What the code shows now, in the golden file's form: {section: {name: [names]}}."""
    served, metrics = server()
    return {"records": records(),
            "json": {**generation(), **generate_json(), **bench_json(), **served},
            "metrics": metrics,
            "vocabularies": vocabularies()}


# ---------------------------------------------------------------- comparing

def differences(golden: Mapping[str, Mapping[str, list[str]]], now: Mapping[str, Mapping[str, list[str]]]
                ) -> list[str]:
    """One line per name added or removed, and per list whose names moved (records' field order)."""
    lines = []
    for section in sorted(golden.keys() | now.keys()):
        old, new = golden.get(section, {}), now.get(section, {})
        for name in sorted(old.keys() | new.keys()):
            where = f"{section} > {name}"
            if name not in old:
                lines.append(f"  added    {where}" + (f": {', '.join(new[name])}" if new[name] else ""))
            elif name not in new:
                lines.append(f"  removed  {where}")
            else:
                lines += [f"  added    {where}: {x}" for x in new[name] if x not in old[name]]
                lines += [f"  removed  {where}: {x}" for x in old[name] if x not in new[name]]
                if sorted(old[name]) == sorted(new[name]) and old[name] != new[name]:
                    lines.append(f"  reordered {where}: now {', '.join(new[name])}")
    return lines


def check(golden: Mapping[str, Mapping[str, list[str]]], now: Mapping[str, Mapping[str, list[str]]]) -> None:
    diff = differences(golden, now)
    assert not diff, ("the names that users and scripts read changed (against "
                      f"{GOLDEN.relative_to(TESTS.parent)}):\n" + "\n".join(diff) +
                      "\nIf this is meant, list each rename, removal or addition in CHANGELOG.md, then regenerate "
                      f"the golden file:\n    {WRITE}")


def test_the_public_names_are_the_golden_ones():
    check(json.loads(GOLDEN.read_text()), collect())


def test_a_fabricated_field_fails_with_a_readable_diff(monkeypatch):
    """Through the real path: Stats.to_dict() with a field more and one fewer, and a bench.json key gone,
    against what the code shows unchanged (so this holds whether or not the golden file is current)."""
    to_dict = events.Stats.to_dict

    def changed(self: events.Stats) -> dict[str, Any]:
        out = to_dict(self)
        out["fabricated_field"] = 1
        del out["seed"]
        return out

    monkeypatch.setattr(events.Stats, "to_dict", changed)
    now = {**collect(), "json": {**collect()["json"], **generation()}}
    now["json"]["bench.json"] = [p for p in now["json"]["bench.json"] if p != "runs[].output_sha"]
    golden = collect()
    try:
        check(golden, now)
    except AssertionError as e:
        message = str(e)
    else:
        raise AssertionError("a fabricated field passed the golden check")
    assert "  added    json > Stats.to_dict(): fabricated_field\n" in message
    assert "  removed  json > Stats.to_dict(): seed\n" in message
    assert "  removed  json > bench.json: runs[].output_sha\n" in message
    assert "CHANGELOG.md" in message and WRITE in message
    assert len(differences(golden, now)) == 3  # nothing else: the rest of the collection is unchanged


def test_a_reordered_record_and_a_renamed_metric_are_named():
    golden = {"records": {"Round": ["index", "mode"]}, "metrics": {"ssd_edge_rounds_total": ["proposer"]}}
    now = {"records": {"Round": ["mode", "index"]}, "metrics": {"ssd_edge_round_total": ["proposer"]}}
    assert differences(golden, now) == ["  added    metrics > ssd_edge_round_total: proposer",
                                        "  removed  metrics > ssd_edge_rounds_total",
                                        "  reordered records > Round: now mode, index"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {WRITE}")
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(collect(), indent=1) + "\n")
    print(f"wrote {GOLDEN}")
