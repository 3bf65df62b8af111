"""SSD pre-speculation in the engine on the fake backend: the speculation cache,
the KV-cell budget, partial reuse, backup switching, rollback and re-probe,
cancellation, and losslessness on every path. The planning it relies on is
tested offline in tests/unit/test_planner.py."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from fakes import FakeContext, FakeModel
from ssd_edge.config import EngineConfig
from ssd_edge.engine import Engine
from ssd_edge.errors import DraftSideError
from ssd_edge.events import FinishEvent, TokenEvent
from ssd_edge.speculation.prespec import PrespecWorker, handoff


def fake_engine(mode: str = "ssd", *, disagree_every: int = 5, k: int = 4, draft_delay=0.0, target_delay=0.0,
                ngram_min: int = 2, n_ctx: int = 512, **prespec) -> tuple[Engine, FakeContext]:
    cfg = EngineConfig.build(target=dict(path="fake-target"), draft=dict(path="fake-draft"), n_ctx=n_ctx, mode=mode,
                             spec=dict(k=k, ngram_min=ngram_min), prespec=dict(prespec))
    target = FakeModel("target")
    draft = FakeModel("draft", disagree_every=disagree_every)
    draft_ctx = FakeContext(draft, n_ctx=1024, n_seq_max=cfg.prespec.fanout_max + 1, decode_delay=draft_delay)
    return (Engine.from_parts(cfg, target, FakeContext(target, n_ctx=n_ctx, decode_delay=target_delay), draft, draft_ctx),
            draft_ctx)


PROMPT = [3, 9, 4, 17, 2]


def run(engine: Engine, mode: str, n: int = 60, **kw):
    return engine.complete(tokens=PROMPT, max_tokens=n, mode=mode, **kw)


@pytest.mark.parametrize("prespec", [
    dict(),                                   # default window
    dict(budget_cells=64, fanout_max=8),      # generous: most outcomes prepared
    dict(budget_cells=4),                     # one branch at most
    dict(budget_cells=0),                     # nothing prepared: every lookup is 'none', JIT drafts
    dict(budget_cells=2, backup_after_misses=1, rollback_after_misses=3, probe_every=2),
])
def test_ssd_greedy_equals_ar_on_every_path(prespec):
    eng, _ = fake_engine(**prespec)
    ref = run(eng, "ar")
    out = run(eng, "ssd")
    assert out.tokens == ref.tokens
    assert len(out.tokens) == 60


@pytest.mark.parametrize("mode", ["ar", "sd", "lookup", "ssd"])
def test_an_answer_that_fills_the_context_stops_and_keeps_its_tokens(mode):
    """Round by round the target must hold history + draft; when no room is left the answer ends
    with "context" and a message, and what it emitted so far is ar's answer, whole."""
    eng, _ = fake_engine(mode, n_ctx=64)
    out = eng.complete(tokens=PROMPT, max_tokens=500, mode=mode)
    assert out.stop_reason == "context" and len(PROMPT) + len(out.tokens) == 64
    wide, _ = fake_engine("ar")
    assert out.tokens == wide.complete(tokens=PROMPT, max_tokens=len(out.tokens), mode="ar").tokens
    fins = [ev for ev in fake_engine(mode, n_ctx=64)[0].generate(tokens=PROMPT, max_tokens=500, mode=mode)
            if isinstance(ev, FinishEvent)]
    assert fins[0].message == "the context of 64 tokens is full"


def test_ssd_hits_when_draft_agrees_and_target_is_slow():
    # The target takes 20 ms a verify; the draft 1 ms a step: pre-speculation finishes in time.
    eng, _ = fake_engine(disagree_every=0, target_delay=0.02, draft_delay=0.001)
    out = run(eng, "ssd")
    pre = out.stats.prespec
    assert out.tokens == run(eng, "ar").tokens
    assert pre.hits >= 0.8 * pre.lookups and pre.lookups > 5
    assert out.stats.speculators.get("prespec", 0) >= pre.hits


def test_ssd_partial_hit_reuses_prefix_when_verify_is_faster_than_the_branch():
    # Verify takes 35 ms; preparing a 4-token branch takes 50 ms: the result arrives mid-branch.
    eng, _ = fake_engine(disagree_every=0, target_delay=0.035, draft_delay=0.01)
    out = run(eng, "ssd", n=40)
    assert out.tokens == run(eng, "ar", n=40).tokens
    assert out.stats.prespec.partial_hits > 0


def test_branch_cells_never_exceed_the_budget():
    budget = 9
    eng, draft_ctx = fake_engine(budget_cells=budget, fanout_max=6, disagree_every=3, target_delay=0.01)
    seen = []
    original = draft_ctx.decode

    def checked(tokens, positions, seqs, logits_for, copy=True):
        out = original(tokens, positions, seqs, logits_for, copy)
        main = eng.draft_kv.seq  # the worker's main sequence (a hit moves it onto the branch)
        seen.append(draft_ctx.cells_outside(main))
        return out

    draft_ctx.decode = checked
    out = run(eng, "ssd")
    assert out.tokens == run(eng, "ar").tokens
    assert max(seen) <= budget
    assert max(seen) > 0  # branches were really made
    assert out.stats.prespec.branch_cells_peak <= budget


def test_cache_key_is_accepted_count_and_emitted_token():
    # The draft disagrees every 7th position: some rounds reject (recovery branches a < k get hit),
    # some accept all (bonus branches a == k get hit).
    # (a window of 6 outcomes from the start: both kinds of outcome are prepared whatever the estimates)
    eng, _ = fake_engine(disagree_every=7, budget_cells=64, fanout_max=8, fanout_min=6, target_delay=0.01)
    tree = eng._tree("ssd")  # the tree kept on (as where it was found faster): every outcome kind is grown
    tree.on, tree.rate = True, {True: 1e9, False: 0.0}
    events = list(eng.generate(tokens=PROMPT, max_tokens=60, mode="ssd"))
    assert events[-1].tokens == run(eng, "ar").tokens
    rounds = [e.round for e in events[:-1]]
    # a hit right after a round that rejected a draft token: the (a < k, recovery token) key was prepared
    hits_after_reject = [cur for prev, cur in zip(rounds, rounds[1:])
                         if prev.accepted < prev.drafted and cur.prespec == "hit"]
    hits_after_full = [cur for prev, cur in zip(rounds, rounds[1:])
                       if prev.drafted and prev.accepted == prev.drafted and cur.prespec == "hit"]
    assert hits_after_reject and hits_after_full


def test_miss_streak_switches_to_backup_and_rollback_restores_sd():
    # A draft that is wrong in ways it cannot predict: lookups miss.
    eng, _ = fake_engine(disagree_every=-1, budget_cells=8, backup_after_misses=1, rollback_after_misses=4,
                         probe_every=3, target_delay=0.005)
    events = list(eng.generate(tokens=[1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2], max_tokens=60, mode="ssd"))
    states = [e.live.state for e in events[:-1]]
    assert "rolled-back" in states
    # after rolling back it probes again: some later round looks up what pre-speculation prepared
    first_rb = states.index("rolled-back")
    assert any(e.round.prespec is not None for e in events[first_rb + 1:-1])
    assert all(e.round.mode in ("ar", "sd", "lookup", "ssd") for e in events[:-1])  # who served, not the state
    ref = eng.complete(tokens=[1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2], max_tokens=60, mode="ar")
    assert events[-1].tokens == ref.tokens


def test_backup_speculator_serves_rounds_on_a_repetitive_history():
    # (the fake target's text repeats little; unigram matches give the n-gram drafter proposals)
    eng, _ = fake_engine(disagree_every=-1, budget_cells=8, backup_after_misses=1, rollback_after_misses=100,
                         target_delay=0.005, draft_delay=0.01, ngram_min=1)
    prompt = [1, 2, 3, 4] * 6
    out = eng.complete(tokens=prompt, max_tokens=40, mode="ssd")
    assert out.tokens == eng.complete(tokens=prompt, max_tokens=40, mode="ar").tokens
    assert out.stats.speculators.get("ngram", 0) > 0


def in_target_support(tokens, prompt, s) -> list[int]:
    """Positions whose token has probability 0 under the target's sampled distribution there."""
    from fakes import lm_logits
    from ssd_edge.sampling import probs

    ctx, bad = list(prompt), []
    for i, t in enumerate(tokens):
        if probs(lm_logits(ctx), s)[t] == 0.0:
            bad.append(i)
        ctx.append(t)
    return bad


def test_ssd_sampled_runs_and_stays_in_the_target_support():
    # top-k 3: the target's support after any prefix is its 3 likeliest tokens; the draft (which
    # disagrees every 4th position) proposes tokens outside it, and those must never come out.
    eng, _ = fake_engine(disagree_every=4, target_delay=0.002)
    from ssd_edge.config import SamplingConfig
    s = SamplingConfig(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, seed=7)
    for mode in ("ssd", "sd"):
        out = eng.complete(tokens=PROMPT, max_tokens=40, mode=mode, sampling=s)
        assert len(out.tokens) == 40
        assert in_target_support(out.tokens, PROMPT, s) == [], mode
        assert out.stats.drafted > out.stats.accepted > 0, out.stats  # drafts were accepted and rejected


def test_a_partial_hit_cut_to_nothing_is_a_plain_step_greedy_and_sampled(monkeypatch):
    # auto's planner may decide that none of a half-grown branch is worth verifying (it then
    # takes a plain step); with sampling there are no q rows to stack. Found by the soak test.
    from ssd_edge.config import SamplingConfig
    from ssd_edge.planning.planner import Planner
    from ssd_edge.planning.prepared import PreparedProposer
    from ssd_edge.speculation.proposer import PLAIN

    planned = Planner._plan

    def plain_for_a_partial(self, offers, room):
        prepared = dict(offers).get("prepared")
        if prepared is not None and not prepared.finished and len(prepared_now[0].looked.draft) < min(room, 4):
            return PLAIN
        return planned(self, offers, room)

    prepared_now = []
    offer = PreparedProposer.offer

    def remember(self, ask):
        prepared_now[:] = [self]
        return offer(self, ask)

    monkeypatch.setattr(PreparedProposer, "offer", remember)
    monkeypatch.setattr(Planner, "_plan", plain_for_a_partial)
    monkeypatch.setattr(PreparedProposer, "pays", lambda self, verifying=1: True)
    monkeypatch.setattr("ssd_edge.planning.rounds.usable_cores", lambda: 2)  # 1 + 1 threads: the worker runs
    eng, _ = fake_engine("auto", disagree_every=0, target_delay=0.035, draft_delay=0.01)
    out = run(eng, "auto", n=30)
    assert out.tokens == run(eng, "ar", n=30).tokens
    assert out.stats.prespec.partial_hits > 0 and out.stats.speculators.get("none", 0) > 0
    s = SamplingConfig(temperature=0.8, seed=3)
    sampled = eng.complete(tokens=PROMPT, max_tokens=30, mode="auto", sampling=s)
    assert len(sampled.tokens) == 30 and in_target_support(sampled.tokens, PROMPT, s) == []
    pre = sampled.stats.prespec
    assert pre.partial_hits > 0 and sampled.stats.speculators.get("none", 0) > 0, sampled.stats


def test_cancel_stops_ssd_and_leaves_no_thread():
    eng, _ = fake_engine(target_delay=0.01, draft_delay=0.002)
    before = threading.active_count()
    cancel = threading.Event()
    n = 0
    for ev in eng.generate(tokens=PROMPT, max_tokens=500, mode="ssd", cancel=cancel):
        n += 1
        if n == 5:
            cancel.set()
    assert ev.stop_reason == "cancelled"
    assert threading.active_count() == before
    assert not any(t.name == "ssd-draft-worker" for t in threading.enumerate())


def test_abandoned_generator_joins_the_worker():
    eng, _ = fake_engine(target_delay=0.005)
    gen = eng.generate(tokens=PROMPT, max_tokens=100, mode="ssd")
    next(gen)
    gen.close()
    assert not any(t.name == "ssd-draft-worker" for t in threading.enumerate())
    assert eng.complete(tokens=PROMPT, max_tokens=20, mode="ssd").tokens == eng.complete(
        tokens=PROMPT, max_tokens=20, mode="ar").tokens


def test_a_lookup_never_waits_for_a_decode_its_branch_does_not_need():
    """Verify 35 ms; a one-token draft decode 2 ms, a batch 25 ms. The first trees, priced before the
    worker's steps are timed, are too wide to finish: a lookup then aborts the batch in flight (its
    branch keeps what it holds) rather than wait for it, unless that decode finishes the branch looked
    up. Once timed, the tree fits and its finished branches are handed over at once: no hit waits a
    batch decode's 25 ms, and no lookup aborts more than one decode."""
    eng, draft_ctx = fake_engine(disagree_every=0, budget_cells=64, fanout_max=6, fanout_min=4,
                                 target_delay=0.035, draft_delay=lambda n: 0.002 if n == 1 else 0.025)
    events = [ev for ev in eng.generate(tokens=PROMPT, max_tokens=40, mode="ssd") if isinstance(ev, TokenEvent)]
    rounds = [ev.round for ev in events]
    assert tuple(t for ev in events for t in ev.tokens) == run(eng, "ar", n=40).tokens
    hits = [r for r in rounds if r.prespec == "hit"]
    lookups = [r for r in rounds if r.prespec is not None]
    assert len(hits) >= 4
    assert all(r.draft_wait_ms < 20 for r in hits), [r.draft_wait_ms for r in hits]  # not a batch decode's 25
    assert draft_ctx.aborted <= len(lookups)
    assert [r.prespec for r in lookups[-5:]].count("hit") >= 3  # the tree timed: it fits the verify


def _lookup_calls(monkeypatch) -> list[str]:
    """The statuses the worker answers lookup calls with, in order (a lookup answered without a call is not there)."""
    answers: list[str] = []
    real_call = PrespecWorker._call

    def call(self, kind, *args):
        out = real_call(self, kind, *args)
        if kind == "lookup":
            answers.append(out.status)
        return out

    monkeypatch.setattr(PrespecWorker, "_call", call)
    return answers


def test_a_miss_the_plan_never_ranked_is_told_without_asking_the_worker(monkeypatch):
    """A draft wrong in ways its own candidates do not predict: the target's token is never among the
    outcomes ranked. The worker publishes its plan before the first branch decode; the engine tells
    such a miss from it without a call (no wait for the worker, no abort of its decode), counts its
    reason, and the worker drops its branches on a message nobody waits for."""
    answers = _lookup_calls(monkeypatch)
    eng, _ = fake_engine(disagree_every=-1, draft_delay=0.002, target_delay=0.02)
    out = run(eng, "ssd", n=60)
    asked = [a for a in answers if a != "none"]  # lookups that found the worker preparing ("none": it sat out)
    st = out.stats.prespec
    told = st.miss_reasons.get("wrong-token", 0) + st.miss_reasons.get("wrong-count", 0)
    assert st.misses == st.lookups > 10 and told >= st.misses / 2
    assert len(asked) <= st.lookups - told  # (a round whose plan was not out yet asks)
    assert out.tokens == run(eng, "ar", n=60).tokens


def test_a_round_the_worker_sat_out_is_looked_up_without_asking_it(monkeypatch):
    """Misses on every lookup roll pre-speculation back to sd: the worker sits rounds out. A lookup with
    no round prepared since the last one is "none" without a call (its answer could be nothing else),
    so the worker is asked only about rounds it prepared; the answer stays ar's."""
    asked = _lookup_calls(monkeypatch)
    eng, _ = fake_engine(disagree_every=-1, draft_delay=0.002, target_delay=0.02, rollback_after_misses=2,
                         probe_every=4)
    events = [ev for ev in eng.generate(tokens=PROMPT, max_tokens=60, mode="ssd") if isinstance(ev, TokenEvent)]
    sat_out = [ev.round for ev in events[1:] if ev.round.prespec is None and ev.round.drafted]
    assert len(sat_out) >= 5  # rolled back: rounds drafted just in time with no lookup of anything prepared
    assert "none" not in asked
    assert tuple(t for ev in events for t in ev.tokens) == run(eng, "ar", n=60).tokens


def test_stale_sequences_go_after_a_read_never_between_an_answer_and_the_engine(monkeypatch):
    """The sequences a call drops (a miss's branches, the main sequence a hit replaces) are removed after
    the next round's read, while the engine is in its verify's decode, or at the end: removed right after
    the worker answers, they held the interpreter's lock the engine needed to take the answer (0.23 ms of
    a priced miss's round trip, 0.06 without). Lookups that miss and hits both leave stale sequences."""
    where: list[tuple[str, int]] = []
    real = PrespecWorker._clear_stale

    def clear(self):
        where.append((sys._getframe(1).f_code.co_name, len(self.stale)))  # (the caller's name)
        real(self)

    monkeypatch.setattr(PrespecWorker, "_clear_stale", clear)
    eng, _ = fake_engine(disagree_every=3, draft_delay=0.002, target_delay=0.02)
    out = run(eng, "ssd", n=60)
    st = out.stats.prespec
    assert st.hits and st.misses
    assert {w for w, _ in where} <= {"_prepare", "_finish"} and any(n for _, n in where)
    assert out.tokens == run(eng, "ar", n=60).tokens


def test_threads_follow_the_mode_unless_pinned():
    eng, _ = fake_engine()
    eng.config = eng.config.model_copy(update={"threads_follow_mode": True})
    from ssd_edge.config import split_threads, usable_cores
    for mode in ("ar", "sd", "ssd"):
        t, d = split_threads(mode, True, usable_cores())
        eng.complete(tokens=PROMPT, max_tokens=4, mode=mode)
        assert eng.threads == (t, d)


def test_the_worker_reads_no_policy_only_the_snapshot_each_verify_hands_it(monkeypatch):
    """The policy is the engine thread's: every attribute read of it (observations, the inputs it
    gives the planner, snapshot) happens there, while the worker thread prepares branches from its snapshot."""
    from ssd_edge.speculation import policy

    readers = set()

    class Watched(policy.PrespecPolicy):
        def __getattribute__(self, name):
            readers.add(threading.current_thread().name)
            return super().__getattribute__(name)

    monkeypatch.setattr(policy, "PrespecPolicy", Watched)
    eng, _ = fake_engine(draft_delay=0.001, target_delay=0.003)
    out = run(eng, "ssd")
    assert out.stats.prespec.hits + out.stats.prespec.partial_hits > 0 and out.stats.prespec.prepared_tokens > 0
    assert readers == {threading.current_thread().name}
    assert out.tokens == run(eng, "ar").tokens


def test_a_policy_snapshot_does_not_follow_later_observations():
    from ssd_edge.config import PrespecConfig
    from ssd_edge.planning.acceptance import DraftAcceptance
    from ssd_edge.speculation.policy import PrespecPolicy

    pol, acceptance = PrespecPolicy(PrespecConfig()), DraftAcceptance(3)
    snap = pol.snapshot(acceptance.p_accept(3), 3)
    before = snap.p_accept.tolist()
    for _ in range(5):
        acceptance.observe(3, 0, {})
        pol.observe_lookup("hit")
    assert snap.p_accept.tolist() == before != acceptance.p_accept(3).tolist()
    assert len(snap.p_accept) == 4 and abs(sum(snap.p_accept) - 1) < 1e-9


@pytest.mark.parametrize("disagree_every", [4, 3, -1])
def test_every_miss_says_why(disagree_every):
    """Stats.prespec.miss_reasons: each lookup that found no branch is counted under one reason
    (events.MISS_REASONS), and the reasons add up to the misses. A draft wrong in ways its own
    candidates do not predict (-1) prepares the accepted count but not the target's next token."""
    from ssd_edge.events import MISS_REASONS

    eng, _ = fake_engine(disagree_every=disagree_every, draft_delay=0.002, target_delay=0.004)
    st = run(eng, "ssd", n=80).stats.prespec
    assert st.lookups > 10 and sum(st.miss_reasons.values()) == st.misses
    assert set(st.miss_reasons) <= set(MISS_REASONS)
    if disagree_every < 0:  # (under load a round can also end before its plan ranked anything)
        assert st.misses == st.lookups and st.miss_reasons.get("wrong-token", 0) >= st.misses / 2


def test_a_round_reads_before_it_removes_the_sequences_the_last_one_left(monkeypatch):
    """After a hit the other branches, and the main sequence the hit replaced, are stale: their cells
    go after the next round's read (each KV verb is 20-40 us on llama.cpp's cache here), so the read
    starts as the verify does; and every stale sequence is free again before a branch takes it."""
    from ssd_edge.speculation.prespec import worker as worker_mod

    log: list[tuple[str, int]] = []  # (what, how many stale sequences) on the worker thread
    read, prepare = worker_mod.PrespecWorker._read, worker_mod.PrespecWorker._prespec

    def reading(self, full, rows):
        assert not set(self.stale) & set(self.free_seqs)  # (raised on the engine thread at its next call)
        log.append(("read", len(self.stale)))
        return read(self, full, rows)

    def preparing(self, *args):
        log.append(("round", len(self.stale)))
        return prepare(self, *args)

    monkeypatch.setattr(worker_mod.PrespecWorker, "_read", reading)
    monkeypatch.setattr(worker_mod.PrespecWorker, "_prespec", preparing)
    eng, draft_ctx = fake_engine(disagree_every=7, budget_cells=64, fanout_max=8, fanout_min=6, target_delay=0.01)
    tree = eng._tree("ssd")  # the tree kept on: several branches a round, one adopted, the others stale
    tree.on, tree.rate = True, {True: 1e9, False: 0.0}
    removed = []
    rm = draft_ctx.seq_rm

    def watched(seq, p0=0, p1=-1):
        if threading.current_thread().name == "ssd-draft-worker" and p0 == 0 and p1 == -1:
            removed.append((seq, len(log)))
        return rm(seq, p0, p1)

    draft_ctx.seq_rm = watched
    out = run(eng, "ssd")
    assert out.tokens == run(eng, "ar").tokens, out.stats.prespec
    rounds = [i for i, (what, _) in enumerate(log) if what == "round"]
    deferred = [i for i in rounds if log[i][1] > 0 and i + 1 < len(log) and log[i + 1][0] == "read"]
    assert deferred  # rounds that began with the last one's sequences still to remove
    for i in deferred:  # none of them removed between the round's start and its read
        assert not [seq for seq, at in removed if at == i + 1], (i, removed)


def _worker_decodes(monkeypatch, draft_ctx, fault) -> None:
    """The first draft decode of a just-in-time draft by SSD's worker, after its 10th decode, runs
    `fault` first, once (a decode no lookup aborts; the engine thread's own decodes are left alone)."""
    plain, count, drafting, fired = draft_ctx.decode, iter(range(1_000_000)), threading.local(), []
    draft_now = PrespecWorker._draft_now

    def decode(*args, **kwargs):
        if threading.current_thread().name == "ssd-draft-worker" and next(count) >= 10 and \
                getattr(drafting, "now", False) and not fired:
            fired.append(True)
            fault()
        return plain(*args, **kwargs)

    def drafts_now(self, *args, **kwargs):
        drafting.now = True
        try:
            return draft_now(self, *args, **kwargs)
        finally:
            drafting.now = False
    monkeypatch.setattr(draft_ctx, "decode", decode)
    monkeypatch.setattr(PrespecWorker, "_draft_now", drafts_now)


def _no_worker_left(within: float = 5.0) -> bool:
    end = time.monotonic() + within
    while any(t.name == "ssd-draft-worker" for t in threading.enumerate()):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_a_draft_side_that_fails_ends_the_generation_with_a_clear_error_and_the_next_runs(monkeypatch):
    eng, draft_ctx = fake_engine(target_delay=0.005)
    want = run(eng, "ar", 40).tokens

    def lost():
        raise RuntimeError("device lost")
    _worker_decodes(monkeypatch, draft_ctx, lost)
    with pytest.raises(DraftSideError, match="draft side failed: RuntimeError: device lost"):
        run(eng, "ssd", 300)
    assert _no_worker_left(0.0) and eng.draft_loaded
    assert run(eng, "ssd", 40).tokens == want


@pytest.mark.parametrize("heeds_abort", [True, False])
def test_a_draft_side_that_hangs_ends_the_generation_and_the_next_runs(monkeypatch, heeds_abort):
    """A decode stuck on the worker's thread: the engine waits HANG_S without a decode begun, then ends
    the generation with DraftSideError. A decode that heeds the abort lets go, and the draft is used
    again; one that does not keeps the draft context, which the engine leaves to it (never closed
    under it) and runs on without."""
    monkeypatch.setattr(handoff, "HANG_S", 0.3)
    monkeypatch.setattr(handoff, "WATCH_S", 0.02)
    eng, draft_ctx = fake_engine(target_delay=0.005)
    want = run(eng, "ar", 40).tokens
    stuck = threading.Event()

    def hang():
        while not (stuck.is_set() or heeds_abort and draft_ctx.abort.is_set()):
            time.sleep(0.005)
    _worker_decodes(monkeypatch, draft_ctx, hang)
    t0 = time.monotonic()
    with pytest.raises(DraftSideError, match="not answered"):
        run(eng, "ssd", 300)
    assert time.monotonic() - t0 < 3.0
    assert eng.draft_loaded == heeds_abort
    if heeds_abort:
        assert _no_worker_left(0.0)
        assert run(eng, "ssd", 40).tokens == want
    else:
        assert run(eng, "ar", 40).tokens == want  # the target runs on while the hung thread holds the draft
        stuck.set()  # the stuck decode returns: its thread sees the stop and ends
        assert _no_worker_left()


def test_a_verify_is_timed_from_its_decode_not_from_the_planning_for_the_worker(monkeypatch):
    """The verify's time (Round.verify_ms: what the planner's contention and the bench's verify_slowdown
    compare, beside the worker and alone) is the target's decode; the planning before it that hands the
    worker its round (tree shape, policy snapshot) is the round's host time, before the verify."""
    from ssd_edge.planning.prepared import PreparedProposer
    plain = PreparedProposer.verifying

    def slow_planning(self, *args):
        time.sleep(0.03)
        return plain(self, *args)
    monkeypatch.setattr(PreparedProposer, "verifying", slow_planning)
    eng, _ = fake_engine(target_delay=0.002)
    rounds = [ev.round for ev in eng.generate(tokens=PROMPT, max_tokens=30, mode="ssd") if isinstance(ev, TokenEvent)]
    assert len(rounds) > 3
    assert all(r.verify_ms < 25 and r.draft_wait_ms >= 30 for r in rounds), rounds
