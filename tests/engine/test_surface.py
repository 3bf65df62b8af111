"""The engine's public surface for its faces and for calibrate (reset, model info, chat
rendering, token pieces, thread counts, decode timing), on the fake backend: each leaves the
KV caches in a state the next generation can trust, which the losslessness checks prove."""

from __future__ import annotations

from pathlib import Path

from fakes import FakeContext, FakeModel
from ssd_edge.bench import calibrate, timings
from ssd_edge.config import EngineConfig
from ssd_edge.engine import Engine

PROMPT = [3, 9, 4, 17, 2]


def fake_engine(draft: bool = True, delay: float = 0.0) -> tuple[Engine, FakeContext, FakeContext | None]:
    cfg = EngineConfig.build(target=dict(path="fake-target"), draft=dict(path="fake-draft") if draft else None,
                             n_ctx=512, mode="sd" if draft else "ar", spec=dict(k=3))
    target = FakeModel("target")
    target_ctx = FakeContext(target, decode_delay=delay)
    draft_model = FakeModel("draft", disagree_every=4) if draft else None
    draft_ctx = FakeContext(draft_model, n_ctx=1024, n_seq_max=cfg.prespec.fanout_max + 1,
                            decode_delay=delay) if draft else None
    return Engine.from_parts(cfg, target, target_ctx, draft_model, draft_ctx), target_ctx, draft_ctx


def test_model_facts_come_from_the_engine():
    eng, _, _ = fake_engine()
    assert eng.has_draft and eng.model_paths == (Path("/fake/target.gguf"), Path("/fake/draft.gguf"))
    assert eng.model_info == (None, None)  # the fakes cannot tell; a real Model's info() is read at load
    assert eng.n_vocab == 32
    assert eng.piece(5) == eng.target.piece(5)
    messages = [{"role": "user", "content": "hi"}]
    assert eng.render_chat(messages) == eng.target.render_chat(messages)
    assert eng.prompt_tokens(messages=messages) == eng.tokenize(eng.render_chat(messages), parse_special=True)
    alone, _, _ = fake_engine(draft=False)
    assert not alone.has_draft and alone.model_paths[1] is None and alone.threads == (1, None)


def test_reset_makes_the_next_generation_read_its_whole_prompt():
    eng, target_ctx, draft_ctx = fake_engine()
    first = eng.complete(tokens=PROMPT, max_tokens=12, mode="sd")
    assert target_ctx.cells and draft_ctx.cells
    eng.reset()
    assert target_ctx.cells == [] and draft_ctx.cells == []
    target_ctx.batch_sizes.clear()
    again = eng.complete(tokens=PROMPT, max_tokens=12, mode="ar")  # kept, the cache would serve 4 of the 5
    assert target_ctx.batch_sizes[0] == len(PROMPT) and again.tokens == first.tokens


def test_use_threads_sets_each_context_and_leaves_none_alone():
    eng, _, _ = fake_engine()
    eng.use_threads(2, 1)
    assert eng.threads == (2, 1)
    eng.use_threads(draft=2)
    assert eng.threads == (2, 2)


def test_timing_leaves_each_cache_holding_the_prefix_and_generation_stays_lossless():
    eng, target_ctx, draft_ctx = fake_engine(delay=0.002)
    ref = eng.complete(tokens=PROMPT, max_tokens=20, mode="ar").tokens
    prefix = list(range(40, 56))
    timer = eng.decode_timer()
    ms = timer.decode_ms("target", prefix, [7, 8, 9], reps=3)
    assert ms >= 2.0 and target_ctx.seq_tokens(0) == prefix and list(eng.target_kv.tokens) == prefix
    target_x, draft_x = timer.contention(prefix, [7, 8], pairs=3)
    assert target_x > 0 and draft_x > 0  # (fake decodes sleep: no contention to speak of)
    assert draft_ctx.seq_tokens(0) == prefix == list(eng.draft_kv.tokens)
    assert eng.complete(tokens=PROMPT, max_tokens=20, mode="sd").tokens == ref


def test_calibrate_measures_through_the_public_surface_and_restores_the_threads(tmp_path):
    eng, _, _ = fake_engine()
    for model in (eng.target, eng.draft):  # the profile names each model by its file's name and size
        model.path = tmp_path / model.path.name
        model.path.write_bytes(b"GGUF")
    eng.use_threads(1, 1)
    ref = eng.complete(tokens=PROMPT, max_tokens=16, mode="ar").tokens
    seen = []
    p = calibrate.measure(eng, k_max=2, reps=1, probe_tokens=8, pairs=2,
                          progress=lambda what, frac: seen.append(frac))
    splits = {(c.target_threads, c.draft_threads) for c in p.costs}
    opts = calibrate.thread_options(p.device.cores)
    assert splits == {(t, d) for t in opts for d in opts}
    assert all(len(c.target_ms) == 3 and len(c.draft_ms) == 3 for c in p.costs)
    assert 0.0 <= p.acceptance.alpha <= 1.0 and seen[-1] == 1.0
    assert all(c.target_overlap >= 1.0 for c in p.costs)  # never below 1: measured again, then read as 1
    assert seen == sorted(seen)
    assert eng.threads == (1, 1)
    assert eng.complete(tokens=PROMPT, max_tokens=16, mode="sd").tokens == ref


def paths_on_disk(eng: Engine, tmp_path: Path) -> None:
    for model in (eng.target, eng.draft):  # the profile names each model by its file's name and size
        model.path = tmp_path / model.path.name
        model.path.write_bytes(b"GGUF")


def test_calibrate_beside_other_work_saves_a_provisional_profile_measured_again_when_quiet(tmp_path, monkeypatch):
    """A machine with another program on one core: the target's one-token step on every core runs
    slower than on one (an ordering no idle machine shows). Measured again, it stays so: provisional.
    needs_first_use then asks for a new measurement once the machine is quiet, not before."""
    monkeypatch.setenv("SSD_EDGE_HOME", str(tmp_path))
    monkeypatch.setattr(calibrate.prof, "device_info", lambda: calibrate.prof.DeviceInfo(
        machine="x86_64", cpu="fake", cores=2, llama_cpp_python="0.3.36"))
    eng, target_ctx, draft_ctx = fake_engine()
    paths_on_disk(eng, tmp_path)
    eng.config = eng.config.model_copy(update={"mode": "auto"})
    for ctx in (target_ctx, draft_ctx):  # every core 2x slower than one thread: a core is busy
        ctx.decode_delay = lambda n, ctx=ctx: (0.004 if ctx.threads >= 2 else 0.002) * (1 + 0.2 * n)
    busy = [0.0]
    monkeypatch.setattr(calibrate, "busy_cores", lambda: busy[0])  # (the reading itself: the inversion decides)
    p, measured = calibrate.ensure_profile(eng, recalibrate=True, k_max=2, reps=1, probe_tokens=4, pairs=2)
    assert measured and p.provisional
    assert timings.inverted_at({t: c.target_ms for t, c in ((c.target_threads, c) for c in p.costs)}) == [2]
    assert "measured again" in calibrate.provisional_text(p)
    busy[0] = 1.0  # still busy: the provisional profile serves, nothing is measured
    assert not calibrate.needs_first_use(eng)
    busy[0] = 0.0  # quiet now, but just measured: not at every start
    assert not calibrate.needs_first_use(eng)
    monkeypatch.setattr(calibrate, "PROVISIONAL_RETRY_S", 0.0)  # quiet, and long enough ago: measured again
    assert calibrate.needs_first_use(eng)
    for ctx in (target_ctx, draft_ctx):
        ctx.decode_delay = lambda n, ctx=ctx: (0.002 if ctx.threads >= 2 else 0.004) * (1 + 0.2 * n)
    p = calibrate.calibrate_first_use(eng)
    assert not p.provisional and not calibrate.needs_first_use(eng)


def test_a_calibration_with_busy_cores_read_is_provisional(tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_EDGE_HOME", str(tmp_path))
    monkeypatch.setattr(calibrate, "busy_cores", lambda: 1.0)
    eng, _, _ = fake_engine()
    paths_on_disk(eng, tmp_path)
    p = calibrate.measure(eng, k_max=1, reps=1, probe_tokens=4, pairs=2)
    assert p.provisional and p.busy_cores == 1.0


def test_inverted_counts_are_those_slower_than_fewer_threads():
    assert timings.inverted_at({1: [50.0], 2: [30.0]}) == []
    assert timings.inverted_at({1: [50.0], 2: [51.0]}) == []  # within the slack
    assert timings.inverted_at({1: [50.0], 2: [70.0], 4: [40.0]}) == [2]
