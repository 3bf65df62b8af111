"""Structured output on the fake backend (one character a token: tests/fakes.ALPHABET): every mode gives
mode ar's tokens under the same constraint, greedy and seed for seed when sampled, with a logit bias and
penalties too; the answers fit their grammar; the grammar's forced runs ride verifies as free drafts;
logprobs; bad constraints fail before any token. (The real models' checks: tests/real/test_structured_real.py.)"""

from __future__ import annotations

import json
import math
import re

import pytest

from ssd_edge import Engine, EngineConfig
from ssd_edge.config import SamplingConfig
from ssd_edge.errors import ConfigError
from ssd_edge.structured import ConstraintError, Grammar, JsonObject, JsonSchema, Regex
from tests.fakes import ALPHABET, FakeContext, FakeModel

PROMPT = [3, 9, 4, 17, 2]
MODES = ("sd", "lookup", "ssd", "auto")
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 6},
                                           "c": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
          "required": ["a", "b", "c"], "additionalProperties": False}
PATTERN = r"[a-j]{2,4}(, [0-9]{1,3}){3}"


def engine(mode: str = "sd", k: int = 4) -> Engine:
    cfg = EngineConfig.build(target=dict(path="fake-target"), draft=dict(path="fake-draft"), n_ctx=512, mode=mode,
                             spec=dict(k=k, ngram_min=2))
    target, draft = FakeModel("target", alphabet=ALPHABET), FakeModel("draft", disagree_every=3, alphabet=ALPHABET)
    return Engine.from_parts(cfg, target, FakeContext(target, n_ctx=512), draft,
                             FakeContext(draft, n_ctx=1024, n_seq_max=cfg.prespec.fanout_max + 1))


@pytest.fixture(scope="module")
def eng() -> Engine:
    return engine()


def every_mode_is_ar(eng: Engine, constraint, sampling: SamplingConfig, n: int = 60):
    ref = eng.complete(tokens=PROMPT, max_tokens=n, mode="ar", constraint=constraint, sampling=sampling)
    for mode in MODES:
        out = eng.complete(tokens=PROMPT, max_tokens=n, mode=mode, constraint=constraint, sampling=sampling)
        assert out.tokens == ref.tokens, f"{mode}: not ar's tokens under the constraint"
        assert out.stop_reason == ref.stop_reason
    return ref


@pytest.mark.parametrize("temperature, seed", [(0.0, 1), (1.0, 5), (1.0, 6), (1.5, 7)])
def test_a_json_schema_holds_every_mode_to_ars_tokens(eng, temperature, seed):
    s = SamplingConfig(temperature=temperature, seed=seed)
    ref = every_mode_is_ar(eng, JsonSchema(SCHEMA), s)
    assert ref.stop_reason == "eos", "the grammar completes the object, and then only the end token is allowed"
    obj = json.loads(ref.text)
    assert set(obj) == {"a", "b", "c"} and isinstance(obj["a"], int) and len(obj["c"]) <= 3
    assert ref.text == json.dumps(obj), "rigid separators: json.dumps's own form"


@pytest.mark.parametrize("temperature", [0.0, 1.2])
def test_a_regex_holds_every_mode(eng, temperature):
    ref = every_mode_is_ar(eng, Regex(PATTERN), SamplingConfig(temperature=temperature, seed=3))
    assert re.fullmatch(PATTERN, ref.text), ref.text


def test_a_lark_grammar_and_gbnf_hold_every_mode(eng):
    lark = 'start: "[" item (", " item)* "]"\nitem: /[a-c]+/'
    ref = every_mode_is_ar(eng, Grammar(lark), SamplingConfig(temperature=0.9, seed=11))
    assert re.fullmatch(r"\[[a-c]+(, [a-c]+)*\]", ref.text), ref.text
    gbnf = 'root ::= "{" [0-9]+ "}"'
    ref = every_mode_is_ar(eng, Grammar(gbnf, syntax="gbnf"), SamplingConfig(temperature=0.0))
    assert re.fullmatch(r"\{[0-9]+\}", ref.text), ref.text


def test_bias_and_penalties_hold_every_mode_and_change_the_answer(eng):
    plain = eng.complete(tokens=PROMPT, max_tokens=40, mode="ar")
    banned = plain.tokens[0]
    s = SamplingConfig(temperature=0.0, logit_bias={banned: -100.0}, presence_penalty=1.5, frequency_penalty=0.5)
    ref = every_mode_is_ar(eng, None, s, n=40)
    assert banned not in ref.tokens
    assert ref.tokens != plain.tokens
    sampled = SamplingConfig(temperature=1.0, seed=9, frequency_penalty=2.0)
    every_mode_is_ar(eng, JsonSchema(SCHEMA), sampled)


def test_forced_runs_are_free_drafts_verified_like_any(eng):
    """The schema's keys, quotes and separators are forced: they are proposed without a model (provenance
    grammar), counted in Stats.forced, and the answer takes fewer target rounds than ar's one a token."""
    ar = eng.complete(tokens=PROMPT, max_tokens=60, mode="ar", constraint=JsonSchema(SCHEMA))
    for mode in ("lookup", "sd"):
        out = eng.complete(tokens=PROMPT, max_tokens=60, mode=mode, constraint=JsonSchema(SCHEMA))
        forced = [t for ev_p, t in zip(provenances(eng, mode), out.tokens) if ev_p == "grammar"]
        assert out.stats.forced == len(forced) >= 10, out.stats
        assert out.stats.rounds < ar.stats.rounds
    assert ar.stats.forced == 0, "ar is the reference: nothing drafted, not even forced tokens"


def provenances(eng: Engine, mode: str) -> list[str]:
    out: list[str] = []
    for ev in eng.generate(tokens=PROMPT, max_tokens=60, mode=mode, constraint=JsonSchema(SCHEMA)):
        out.extend(getattr(ev, "provenance", ()))
    return out


def test_a_json_object_is_any_object(eng):
    ref = every_mode_is_ar(eng, JsonObject(), SamplingConfig(temperature=1.0, seed=2), n=80)
    if ref.stop_reason == "eos":
        assert isinstance(json.loads(ref.text), dict)
    else:
        assert ref.text.startswith("{")


def test_logprobs_read_the_row_before_its_shaping(eng):
    """Each kept token's logprob is log softmax of the target's row at temperature 1, before the mask: so
    greedy without a constraint picks the top alternative, and under one the token may be a lower one."""
    out = eng.complete(tokens=PROMPT, max_tokens=12, mode="sd", logprobs=3)
    assert len(out.logprobs) == len(out.tokens)
    for lp, t in zip(out.logprobs, out.tokens):
        assert lp.token == t and len(lp.top) == 3 and lp.top[0][0] == t and lp.logprob == pytest.approx(lp.top[0][1])
        assert all(a[1] >= b[1] for a, b in zip(lp.top, lp.top[1:])) and lp.logprob <= 0
        assert sum(math.exp(p) for _, p in lp.top) <= 1 + 1e-9
    ar = eng.complete(tokens=PROMPT, max_tokens=12, mode="ar", logprobs=0)
    assert [x.logprob for x in ar.logprobs] == pytest.approx([x.logprob for x in out.logprobs], abs=1e-5)
    constrained = eng.complete(tokens=PROMPT, max_tokens=20, mode="auto", constraint=JsonSchema(SCHEMA), logprobs=2)
    assert len(constrained.logprobs) == len(constrained.tokens)
    assert any(x.top[0][0] != x.token for x in constrained.logprobs), "the mask moved some draws off the top"
    events = [ev for ev in eng.generate(tokens=PROMPT, max_tokens=12, mode="sd", logprobs=1) if hasattr(ev, "round")]
    assert sum(len(ev.logprobs) for ev in events) == 12


@pytest.mark.parametrize("constraint, field, says", [
    (JsonSchema({"type": "objekt"}), "json_schema", "objekt"),
    (JsonSchema({"type": "array", "uniqueItems": True}, strict=True), "json_schema", "uniqueItems"),
    (Regex("[a-"), "regex", "regex"),
    (Grammar("start: item\n"), "grammar", "item"),
    (Grammar("root ::= missing", syntax="gbnf"), "grammar", "'missing' not found"),
])
def test_a_bad_constraint_fails_before_any_token(eng, constraint, field, says):
    gen = eng.generate(tokens=PROMPT, max_tokens=5, constraint=constraint)
    with pytest.raises(ConstraintError) as e:
        try:
            next(gen)
        finally:
            gen.close()
    assert e.value.field == field and says in str(e.value) and e.value.exit_code == 2


def test_strict_false_compiles_what_strict_refuses(eng):
    lenient = JsonSchema({"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "maxItems": 2})
    out = eng.complete(tokens=PROMPT, max_tokens=30, constraint=lenient)
    assert isinstance(json.loads(out.text), list)


def test_logprobs_out_of_range_is_a_config_error(eng):
    with pytest.raises(ConfigError, match="logprobs"):
        next(eng.generate(tokens=PROMPT, max_tokens=5, logprobs=21))


def test_a_cut_answer_says_length_and_stop_strings_still_apply(eng):
    cut = eng.complete(tokens=PROMPT, max_tokens=6, mode="sd", constraint=JsonSchema(SCHEMA))
    assert cut.stop_reason == "length" and len(cut.tokens) == 6
    full = eng.complete(tokens=PROMPT, max_tokens=60, mode="sd", constraint=JsonSchema(SCHEMA))
    stopped = eng.complete(tokens=PROMPT, max_tokens=60, mode="sd", constraint=JsonSchema(SCHEMA), stop=['"b"'])
    assert stopped.stop_reason == "stop" and stopped.text == full.text[:full.text.index('"b"')]


def test_the_draft_rows_are_masked_too():
    """A draft whose rows follow the grammar proposes nothing the target's masked rows refuse: under a
    grammar that leaves the fake draft few choices its acceptance is higher than unmasked drafting gives."""
    eng = engine("sd")
    out = eng.complete(tokens=PROMPT, max_tokens=40, mode="sd", constraint=Regex("[0-3]{40}"),
                       sampling=SamplingConfig(temperature=0.0))
    assert out.stats.acceptance_rate is not None and out.stats.acceptance_rate > 0.5


def test_ssd_branches_grow_under_the_grammar(monkeypatch):
    """Each pre-speculated branch carries its own grammar state: every token a branch drafts is one the
    grammar allows after its outcome, so a hit's draft is one the target's masked rows can accept."""
    from ssd_edge.speculation.prespec.outcomes import SpeculationCache

    grown = []
    put = SpeculationCache.put
    monkeypatch.setattr(SpeculationCache, "put", lambda self, br: (grown.append(br), put(self, br))[1])
    eng = engine("ssd")
    for temperature in (0.0, 1.0):
        s = SamplingConfig(temperature=temperature, seed=3)
        ref = eng.complete(tokens=PROMPT, max_tokens=80, mode="ar", constraint=Regex("[0-3]{80}"), sampling=s)
        out = eng.complete(tokens=PROMPT, max_tokens=80, mode="ssd", constraint=Regex("[0-3]{80}"), sampling=s)
        assert out.tokens == ref.tokens
    drafted = [t for br in grown for t in (br.b, *br.tokens)]
    assert len(drafted) >= 10, "the worker prepared branches"
    assert set(b"".join(eng.piece(t) for t in drafted).decode()) <= set("0123")  # unmasked, the draft wanders


def test_tools_none_leaves_the_tools_out(monkeypatch):
    """tool_choice "none" on the Python API answers as if there were no tools: none in the prompt, and the
    answer is content, never read for calls (as the server does)."""
    from ssd_edge.structured import Tools

    eng = engine("ar")
    seen = []
    render = eng.render_chat
    monkeypatch.setattr(eng, "render_chat", lambda messages, tools=None: (seen.append(tools), render(messages))[1])
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    out = eng.complete(messages=[{"role": "user", "content": "hi"}], max_tokens=8, constraint=Tools(tools, "none"))
    assert seen == [None] and out.tool_calls == ()


@pytest.mark.parametrize("seed", [3, 4])
def test_the_infill_sampler_holds_every_mode_to_ars_tokens(eng, seed):
    """llama.vim's sampling (top-k 40, top-p 0.9, infill; temperature 1): the same tokens in every mode, alone
    and under a grammar, and not the answer drawn without the infill sampler (which keeps far fewer tokens)."""
    s = SamplingConfig(temperature=1.0, top_k=40, top_p=0.9, min_p=0.0, seed=seed)
    infill = every_mode_is_ar(eng, None, s.model_copy(update=dict(infill=True)))
    assert infill.tokens != eng.complete(tokens=PROMPT, max_tokens=60, mode="ar", sampling=s).tokens
    every_mode_is_ar(eng, JsonSchema(SCHEMA), s.model_copy(update=dict(infill=True)))
