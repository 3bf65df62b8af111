"""Fill in the middle on the default Qwen pair (it has all six FIM tokens), through `POST /infill` on the
real engine: a function body completed between its signature and the code after it compiles; a repeated
request reads only its last prompt token again (tokens_cached); a FIM token's spelling in the user's code
stays text; /infill greedy in sd, lookup, ssd and auto gives ar's tokens, each run from an empty cache, and
sampled with a seed in sd, ssd and auto ar's draws (a difference passes only as a near-tie proven by
tests/lossless_check.py's replay); with --cache-reuse 256,
a request whose prefix lost lines at the top reads at most a quarter of its prompt again. Lean: one prompt,
48 tokens at most per answer (32 where every mode runs), at the users' thread split."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from conftest import make_engine
from lossless_check import Tally, compare_prompt, generate
from prompts import Prompt
from ssd_edge.config import SamplingConfig, split_threads, usable_cores
from ssd_edge.infill import layout
from ssd_edge.server import create_app

pytestmark = pytest.mark.default_pair

PREFIX = ('import math\n\n\ndef circle_area(radius: float) -> float:\n'
          '    """Return the area of a circle with the given radius."""\n')
SUFFIX = '\n\n\ndef main() -> None:\n    print(circle_area(2.0))\n\n\nif __name__ == "__main__":\n    main()\n'
N = 48
LOSSLESS_N = 32
SAMPLED_N = 24
# the cursor on the body's first line, after its indentation: llama.vim's prompt (the line so far) and n_indent
# (the Instruct model goes on past the function, into the rest of the file and prose: the indentation ends it)
BODY = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [], "prompt": "    ", "n_predict": N,
        "n_indent": 4, "temperature": 0.0, "cache_prompt": True}


@pytest.fixture(scope="module")
def served(default_pair):
    threads = split_threads("auto", True, usable_cores())
    eng = make_engine(default_pair, target=dict(threads=threads[0]), draft=dict(threads=threads[1]))
    eng.load_draft()
    with TestClient(create_app(eng, model_id="qwen")) as c:
        yield c, eng
    eng.close()


@pytest.mark.timeout(600)
def test_a_function_body_filled_in_the_middle_compiles_default_pair(served):
    c, eng = served
    eng.reset()
    r = c.post("/infill", json={**BODY, "mode": "ar"})
    assert r.status_code == 200, r.text
    body = r.json()
    middle = body["content"]
    print(f"middle: {middle!r}")
    assert "return" in middle and body["stop_type"] in ("eos", "limit")
    compile(PREFIX + "    " + middle + SUFFIX, "filled.py", "exec")  # a SyntaxError fails the test
    n = body["tokens_evaluated"]
    assert body["tokens_cached"] == 0 and body["timings"]["prompt_n"] == n
    again = c.post("/infill", json={**BODY, "mode": "ar", "response_fields": ["content", "tokens_cached",
                                                                               "timings/prompt_n"]}).json()
    assert again == {"content": middle, "tokens_cached": n - 1, "timings/prompt_n": 1}


def test_a_fim_tokens_spelling_in_the_code_stays_text_default_pair(served):
    _, eng = served
    fim = eng.target.fim_tokens()
    assert (fim.pre, fim.mid, fim.suf, fim.pad, fim.rep, fim.sep) == (151659, 151660, 151661, 151662, 151663, 151664)
    laid = layout(eng.target, "s = '<|fim_middle|><|file_sep|>'\n", "", n_predict=8)
    assert laid.tokens.count(fim.mid) == 1 and laid.tokens[-1] == fim.mid  # the layout's own, at the end
    assert laid.tokens.count(fim.sep) == 1  # the layout's current-file line, not the user's text


@pytest.mark.timeout(1200)
def test_infill_greedy_in_every_mode_is_ars_default_pair(served):
    c, eng = served
    runs = {}
    for mode in ("ar", "sd", "lookup", "ssd", "auto"):
        eng.reset()  # from an empty cache, as lossless_check's runs: the same first batch
        # without n_indent: the answer runs on past the function (more tokens to compare)
        body = c.post("/infill", json={**BODY, "mode": mode, "n_indent": 0, "n_predict": LOSSLESS_N}).json()
        runs[mode] = body["tokens"]
        assert body["speculation"]["mode"] == mode
    laid = layout(eng.target, PREFIX, SUFFIX, prompt="    ", n_batch=eng.config.n_batch, n_ctx=eng.config.n_ctx,
                  n_predict=LOSSLESS_N)
    differ = [m for m in runs if runs[m] != runs["ar"]]
    if differ:  # only a proven near-tie between batched and one-token rows may explain it
        ar = generate(eng, list(laid.tokens), "ar", LOSSLESS_N)
        assert ar.out == runs["ar"]
        for mode in differ:
            at = next((i for i, (a, b) in enumerate(zip(runs[mode], runs["ar"])) if a != b), None)
            print(f"{mode} differs from ar (first at token {at}): proving a near-tie")
            compare_prompt(eng, Prompt("fim_circle", "code", PREFIX), mode, mode, ar, Tally(), LOSSLESS_N)
    print(f"every mode: {len(runs['ar'])} tokens, {differ or 'none'} differing")



@pytest.mark.timeout(1200)
def test_infill_sampled_seed_for_seed_in_every_mode_is_ars_default_pair(served):
    """Sampled (temperature 0.8, top-k 40, seed 7): each mode draws ar's tokens, as the coupled draws make
    them (a difference passes only as a proven near-tie of the draw's scores). Short answers."""
    c, eng = served
    sampled = {**BODY, "n_predict": SAMPLED_N, "n_indent": 0, "temperature": 0.8, "top_k": 40, "seed": 7}
    runs = {}
    for mode in ("ar", "sd", "ssd", "auto"):
        eng.reset()
        runs[mode] = c.post("/infill", json={**sampled, "mode": mode}).json()["tokens"]
    differ = [m for m in runs if runs[m] != runs["ar"]]
    print(f"sampled, every mode: {len(runs['ar'])} tokens, {differ or 'none'} differing")
    if differ:
        laid = layout(eng.target, PREFIX, SUFFIX, prompt="    ", n_batch=eng.config.n_batch, n_ctx=eng.config.n_ctx,
                      n_predict=SAMPLED_N)
        s = SamplingConfig.model_validate({**eng.config.sampling.model_dump(), "temperature": 0.8, "top_k": 40,
                                           "seed": 7})
        ar = generate(eng, list(laid.tokens), "ar", SAMPLED_N, s)
        assert ar.out == runs["ar"]
        for mode in differ:
            compare_prompt(eng, Prompt("fim_circle", "code", PREFIX), mode, mode, ar, Tally(), SAMPLED_N)

# an editor's window: 256 lines above the cursor in llama.vim, here a short file that fits the prefix's cut
WINDOW = "".join(f"def scale_{i}(values: list[float]) -> list[float]:\n    return [v * {i} for v in values]\n\n\n"
                 for i in range(1, 13))


@pytest.mark.timeout(600)
def test_cache_reuse_moves_what_the_window_kept_default_pair(default_pair):
    """The target's cache and the draft's (mode sd): the second request reads a quarter of its prompt at most,
    and the draft little more than what it drafts (measured: 17 tokens, against 289 when only the target's
    cache moved its chunks)."""
    eng = make_engine(default_pair, cache_reuse=256, target=dict(threads=split_threads("ar", False, usable_cores())[0]))
    try:
        with TestClient(create_app(eng, model_id="qwen")) as c:
            body = {"input_suffix": "\n\nprint(scale_13([1.0]))\n", "n_predict": 16, "n_indent": 4, "mode": "sd",
                    "temperature": 0.0}
            first = c.post("/infill", json={**body, "input_prefix": WINDOW + "def scale_13(values):\n"}).json()
            later = WINDOW.split("\n\n\n", 2)[2]  # the first two functions scrolled out of the window
            read, decode = [], eng.draft_ctx.decode
            eng.draft_ctx.decode = lambda tokens, *a, **k: read.append(len(tokens)) or decode(tokens, *a, **k)
            r = c.post("/infill", json={**body, "input_prefix": later + "def scale_13(values):\n"}).json()
        n = r["tokens_evaluated"]
        print(f"first: {first['content']!r} ({first['tokens_evaluated']} tokens); "
              f"moved: {r['content']!r}, read {r['timings']['prompt_n']} of {n}, the draft {sum(read)}")
        assert r["timings"]["prompt_n"] <= n / 4 and r["tokens_cached"] == n - r["timings"]["prompt_n"]
        assert sum(read) <= n / 4 + 2 * 16  # what moved in, its drafts and the tokens they were read after
        assert first["truncated"] is False and r["content"].strip()
    finally:
        eng.close()


# issue 54, part 4: a middle that copies what the prompt holds (the window's functions repeat one pattern)
COPY = {"input_prefix": WINDOW + "def scale_13(values: list[float]) -> list[float]:\n", "prompt": "    return",
        "input_suffix": "\n\n\nprint(scale_13([1.0]))\n", "input_extra": [], "n_predict": 16, "n_indent": 4,
        "temperature": 0.0}


@pytest.mark.timeout(600)
def test_fim_copies_use_the_ngram_lookup_in_auto_and_ssd_losslessly_default_pair(served):
    """auto plans n-gram rounds where the middle copies the prompt; auto and ssd give ar's tokens (greedy; a
    difference passes only as a proven near-tie). One prompt read, then cached. Whether ssd lets n-gram tokens
    in is checked last: measured 2026-12-07, it did not (draft and prepared rounds only). ssd takes a copy on a
    miss once its match runs LONG_COPY (8) tokens back (rounds.ssd_offers), and a middle's match can run back no
    further than the middle itself (the layout puts <|fim_middle|> right before it): this 11-token middle never
    gets there, so the test is marked xfail there, saying so, until ssd weighs short copies."""
    c, eng = served
    eng.reset()
    runs = {m: c.post("/infill", json={**COPY, "mode": m}).json() for m in ("ar", "auto", "ssd")}
    for m, body in runs.items():
        sp = body["speculation"]
        print(f"{m}: {body['content']!r} rounds {sp['rounds_by_proposer']} tokens {sp['tokens_by_source']}")
    assert "v * 13" in runs["ar"]["content"]  # the copy this test is about
    assert runs["auto"]["speculation"]["rounds_by_proposer"].get("ngram", 0) >= 1
    assert runs["auto"]["speculation"]["tokens_by_source"].get("ngram", 0) >= 1
    differ = [m for m in ("auto", "ssd") if runs[m]["tokens"] != runs["ar"]["tokens"]]
    if differ:  # only a proven near-tie between batched and one-token rows may explain it
        laid = layout(eng.target, COPY["input_prefix"], COPY["input_suffix"], prompt=COPY["prompt"],
                      n_batch=eng.config.n_batch, n_ctx=eng.config.n_ctx, n_predict=COPY["n_predict"])
        ar = generate(eng, list(laid.tokens), "ar", COPY["n_predict"])
        for mode in differ:
            compare_prompt(eng, Prompt("fim_copy", "code", COPY["input_prefix"]), mode, mode, ar, Tally(),
                           COPY["n_predict"])
    if not runs["ssd"]["speculation"]["tokens_by_source"].get("ngram", 0):
        pytest.xfail("ssd took no n-gram token on a middle that copies the prompt (issue 54, part 4): "
                     f"{runs['ssd']['speculation']['rounds_by_proposer']}")
