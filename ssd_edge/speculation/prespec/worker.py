"""The pre-speculation worker: the thread that owns the draft context while SSD is on, grows the
branches that outcomes.py ranks, and answers the engine's lookups (the package's docstring tells the
whole picture)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from ...config import PrespecConfig
from ...errors import DraftSideError, SSDEdgeError
from ...interface import DECODES, Aborted
from ...llama.kvseq import Cancelled
from ...metrics import Meter
from ...sampling import head_width
from ..drafters import Draft, GoOn, ModelDrafter, top_candidates
from ..policy import PolicySnapshot
from .handoff import Base, Growing, Handoff, Ranked, Ready
from .outcomes import Branch, LookupResult, SpeculationCache, decode_heads, outcome_of, rank_outcomes, why_missed

READ_CHUNK = 16  # tokens per decode when the worker reads history it has not seen (its wait bound)
JOIN_S = 1.0     # how long close() waits for a hung worker to let go of the draft context


def _since(mark: tuple[float, int]) -> tuple[float, int]:
    """This thread's (seconds, rows) in decodes since DECODES.read() gave `mark`."""
    seconds, rows = DECODES.read()
    return seconds - mark[0], rows - mark[1]


class PrespecWorker:
    """The draft side of SSD, on its own thread. The engine calls lookup() / extend() / draft_now()
    (blocking; answered between two draft decodes, except a lookup that the worker's publications
    answer: at once) and verifying() (returns at once; starts pre-speculation). It prepares what the
    policy's window and budget allow and never decides how much a round verifies (the planner does).

    Which thread owns what:
    - handoff (handoff.py): all that the two threads share, the queues, the worker's
      publications and the abort flag, with the rule for each. The engine-side methods
      (lookup, extend, draft_now, verifying, close, _call, _preempt) touch only it,
      meter.branches (locked) and, in close(), the thread's handle;
    - everything else is the worker thread's: the drafter, its KVSeq and the draft context, the
      cache and its free and stale sequences, base, the round's plan (_policy, _planned,
      _round_no), _found and error (an error in a message nobody waits for, raised at the next
      call: it reaches the engine only through the outbox). Two reads by the engine thread, each
      at a moment the worker leaves the part alone: drafter.kv, only while the worker waits for a
      call (after an answer, before the next verifying(); never after a hit, whose adopt may be
      under way), and drafter.timing, which only a call (extend) writes, after its answer.
    The worker writes the Meter only through meter.branches and drafter.busy, both
    locked; `cancelled` is the engine's, polled by the worker between decodes."""

    def __init__(self, drafter: ModelDrafter, cfg: PrespecConfig, meter: Meter, n_seq: int,
                 cancelled: Callable[[], bool] | None = None, target: Any = None) -> None:
        self.drafter = drafter
        self.ctx = drafter.ctx
        self.handoff = Handoff(abort=self.ctx.abort)
        # the target's context: where it can, each of its decodes wakes this worker as it starts (Wake)
        self.target = target
        self._target_wakes = self.handoff.wake is not None and hasattr(target, "wake")
        if self._target_wakes:
            target.wake = self.handoff.wake
        self._policy: PolicySnapshot | None = None  # what the round being prepared is ranked by
        self.cfg = cfg
        self.meter = meter
        self.cancelled = cancelled
        self.cache = SpeculationCache()
        self.free_seqs = [s for s in range(n_seq) if s != drafter.kv.seq]
        self.stale: list[int] = []  # sequences dropped whose cells go at the next quiet moment (_clear_stale)
        self.base: Base | None = None  # the verify being prepared for; set only while preparing
        self._found: Branch | None = None  # the branch the last lookup handed over (for extend)
        self._head_width = head_width(drafter.sampling)  # a branch row's head (decode_heads)
        self._round_no = 0  # the round it prepares now (the engine's count, from its verifying message)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ssd-draft-worker", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ engine side
    def lookup(self, history: list[int], k: int) -> LookupResult:
        """What the worker prepared for the outcome that took the verified round to `history`. A
        finished branch for it is handed over at once, without waiting for the worker's decode in
        flight: the worker makes it the main sequence when that decode ends (adopt, queued before any
        later call). Anything else is the worker's to answer, between two of its decodes; but where
        nothing was prepared since the last lookup (a round the worker sat out, a generation's first),
        the answer is "none" without asking: each lookup of a round leaves the worker nothing to hand
        over (its base dropped, by the lookup, the adopt or the miss it told)."""
        h = self.handoff
        if h.looked == h.round:  # (a round's first lookup is the one after its verifying())
            return LookupResult("none", None)
        h.looked = h.round
        ready = h.ready  # one read: the worker replaces the tuple, never changes one
        if ready is not None and ready.round == h.round:
            outcome = outcome_of(ready.base, history)
            br = ready.branches.get(outcome) if outcome is not None else None
            if br is not None:
                h.ready = None
                h.post("adopt", (list(history), k, br))
                self.meter.branches.add_lookup(outcome[0], True, len(ready.branches))
                return LookupResult("hit", br.draft(k), True, depth=br.depth)
        ranked = h.ranked
        if ranked is not None and ranked.round == h.round:
            outcome = outcome_of(ranked.base, history)
            if outcome not in ranked.outcomes:  # no branch was ever begun for it: nothing to wait for
                h.ranked = None
                h.post("missed", ())  # the worker drops its branches, as after a miss it told
                why = why_missed(outcome, ranked.outcomes)
                self.meter.branches.add_miss(why)
                done = len(ready.branches) if ready is not None and ready.round == h.round else 0
                self.meter.branches.add_lookup(outcome[0] if outcome is not None else None, False, done)
                return LookupResult("miss", None, why=why)
        return self._call("lookup", history, k)

    def draft_now(self, history: list[int], k: int, go_on: GoOn | None = None, guess: Sequence[int] = ()) -> Draft:
        return self._call("draft_now", history, k, go_on, guess)

    def extend(self, history: list[int], k: int) -> Draft:
        """Draft the branch that the last lookup found (a partial hit) on to k tokens."""
        return self._call("extend", history, k)

    def _preempt(self, history: list[int] | None = None) -> None:
        """Stop a branch decode in flight: the engine is waiting. A decode is let finish when it finishes
        the branch of the outcome being looked up (`history`): it is the hit.

        Runs on the engine thread; it only reads what the worker publishes before each wave
        (handoff.growing, one attribute read under the GIL) and sets the abort flag, which the
        worker clears before each message it takes."""
        growing = self.handoff.growing
        if growing is None:
            return
        if history is not None and growing.finishing and outcome_of(growing.base, history) in growing.finishing:
            return
        self.handoff.abort.set()

    def verifying(self, history: list[int], draft: Draft, policy: PolicySnapshot) -> None:
        """The target verifies `draft` after `history` now: prepare the likeliest outcomes, ranked and
        bounded by `policy` (the engine thread's planner and policy, frozen for this round)."""
        self.handoff.round += 1
        self.handoff.post("verifying", (self.handoff.round, list(history), draft, policy, time.perf_counter()),
                          bump=not self._target_wakes)  # (the verify's decode bumps the word as it starts)

    def close(self) -> bool:
        """Stop the thread and leave the draft context with one sequence (0). False where a hung thread
        still holds the draft context (JOIN_S after an abort): it must not be used again."""
        if self._thread.is_alive():
            if self.handoff.hung:
                self.handoff.abort.set()
            self.handoff.post("stop", ())
            self._thread.join(JOIN_S if self.handoff.hung else None)
        if self._target_wakes:
            self.target.wake = None
        return not self._thread.is_alive()

    def _call(self, kind: str, *args: Any) -> Any:
        self._preempt(args[0] if kind == "lookup" else None)
        self.handoff.post(kind, args)
        status, value, (seconds, rows) = self.handoff.answer(kind, self._thread, self.ctx)
        DECODES.add(seconds, rows)  # the call's decodes, waited for here, are this thread's time in decodes
        if status == "err":  # (a typed error says what failed; anything else, that the draft side did)
            if isinstance(value, (SSDEdgeError, Cancelled)):
                raise value
            raise DraftSideError(f"SSD's draft side failed: {type(value).__name__}: {value}") from value
        return value

    # ------------------------------------------------------------ worker thread
    def _run(self) -> None:
        while True:
            kind, args = self.handoff.take()
            self.handoff.abort.clear()
            if kind == "stop":
                self._finish()
                return
            decoded = DECODES.read()
            try:
                if kind == "verifying":
                    self._prespec(*args)
                    continue
                if kind == "adopt":
                    self._adopt(*args)
                    continue
                if kind == "missed":
                    self.base = None
                    self._drop_branches()
                    continue
                if self.error is not None:
                    raise self.error
                result = {"lookup": self._lookup, "extend": self._extend, "draft_now": self._draft_now}[kind](*args)
                # (stale sequences wait for the next read: cleared here, they held the lock the answer's taker needs)
                self.handoff.outbox.put(("ok", result, _since(decoded)))
            except BaseException as e:  # handed to the engine thread, raised there
                if kind in ("verifying", "adopt", "missed"):  # nobody waits for these: the next call raises it
                    self.error = e
                else:
                    self.handoff.outbox.put(("err", e, _since(decoded)))

    def _interrupted(self) -> bool:
        return not self.handoff.inbox.empty()

    def _busy(self, t0: float) -> None:
        self.drafter.busy.add(time.perf_counter() - t0)

    def _draft_now(self, history: list[int], k: int, go_on: GoOn | None = None, guess: Sequence[int] = ()) -> Draft:
        self._drop_branches()
        self.base = None
        self._planned: set[tuple[int, int]] = set()
        t0 = time.perf_counter()
        try:
            return self.drafter.extend(history, k=k, cancelled=self.cancelled, go_on=go_on, guess=guess)
        finally:
            self._busy(t0)

    def _lookup(self, history: list[int], k: int) -> LookupResult:
        if self.base is None:
            return LookupResult("none", None)
        outcome = outcome_of(self.base, history)
        self.base = None
        br = self.cache.get(*outcome) if outcome is not None else None
        self._found = br
        finished = br is not None and (br.done or len(br.tokens) >= k)
        self.meter.branches.add_lookup(outcome[0] if outcome is not None else None, finished,
                                       sum(b.done for b in self.cache.branches.values()))
        if br is None:
            why = why_missed(outcome, self._planned)
            self.meter.branches.add_miss(why)
            self._drop_branches()
            return LookupResult("miss", None, why=why)
        self._take(history, k, br)
        return LookupResult("hit" if finished else "partial", br.draft(k), finished, depth=br.depth)

    def _adopt(self, history: list[int], k: int, br: Branch) -> None:
        """The engine took the finished branch `br` for the outcome that gave `history` (lookup())."""
        self.base, self._found = None, br
        self._take(history, k, br)

    def _take(self, history: list[int], k: int, br: Branch) -> None:
        """The branch becomes the main sequence; every other sequence is stale (removed after the next read)."""
        self.cache.branches.pop((br.a, br.b))
        self._drop_branches()
        fed = br.pos - len(history)  # drafted tokens already in the branch's KV (-1: not even b yet)
        held = list(history) + br.tokens[:fed] if fed >= 0 else list(history)[:br.pos]
        self.stale.append(self.drafter.kv.adopt(br.seq, held, drop=False))
        self.meter.branches.add_used(min(len(br.tokens), k))

    def _extend(self, history: list[int], k: int) -> Draft:
        br, self._found = self._found, None
        assert br is not None, "extend() follows a lookup that found a branch"
        t0 = time.perf_counter()
        try:
            return self.drafter.extend(history, br.tokens, br.cands, k=k, cancelled=self.cancelled,
                                       speculator="prespec")
        finally:
            self._busy(t0)

    def _drop_branches(self) -> None:
        self.stale.extend(br.seq for br in self.cache.pop_all())
        self.meter.branches.set_cells(0)

    def _clear_stale(self) -> None:
        """Remove the stale sequences' cells and free them, where nothing waits on the worker: after a round's
        read (the engine is in the verify's decode), at the end; not after a call's answer, where the engine
        waits for the interpreter's lock to take it. (A KV verb: 13 us priced, 20-40 on llama.cpp's here.)"""
        for seq in self.stale:
            self.ctx.seq_rm(seq, 0, -1)
            self.free_seqs.append(seq)
        self.stale.clear()

    def _prespec(self, round_no: int, history: list[int], draft: Draft, policy: PolicySnapshot, sent: float) -> None:
        self._drop_branches()  # a round nobody looked up (k = 0 at the very end) leaves stale ones
        self.base = None
        self.handoff.ready = self.handoff.ranked = None
        self._round_no = round_no
        self._planned = set()  # the outcomes this round's plan ranked (a miss's reason reads it)
        if self._interrupted():
            return
        self._policy = policy  # what _prepare ranks outcomes by
        self.base = (history, draft)  # set only when preparing: lookup() then counts a hit or a miss
        t0 = time.perf_counter()
        try:
            self._prepare(history, draft, policy.depth, sent)
        finally:
            self._busy(t0)

    def _read(self, full: list[int], rows: int) -> np.ndarray | None:
        """Make the main sequence hold `full` and return its last `rows` logit rows, reading in
        chunks of READ_CHUNK tokens; None if the engine asked for the worker in between (what was
        read is kept: the next round reads on from there). A catch-up read (the prompt, rounds the
        draft sat out) can outlast the target's verify, above all where the target already holds
        the prompt in its cache and the draft does not."""
        try:
            return self.drafter.kv.feed(full, rows, self._stop_reading, chunk=READ_CHUNK)
        except Cancelled:
            if self.cancelled is not None and self.cancelled():
                raise  # the generation was cancelled: the engine ends it
            return None

    def _stop_reading(self) -> bool:
        """Whether the worker should stop between two decodes: the engine asks, or the generation ends."""
        return self._interrupted() or (self.cancelled is not None and self.cancelled())

    def _prepare(self, history: list[int], draft: Draft, depth: int, sent: float) -> None:
        """Rank the outcomes of the verify of `draft` after `history` (begun at `sent`, perf_counter) and
        grow the likeliest ones' branches together, as many as the policy's width: the likeliest `depth`
        tokens deep, the others as deep as its `short`."""
        k = len(draft)
        t_read = time.perf_counter()
        temp = self.drafter.cand_temperature()
        cands = list(draft.cands or ())
        new = len(cands) < k  # not drafted by the model here (n-gram backup): its rows give the candidates
        rows = self._read(history + list(draft.tokens), k + 1 if new else 1)
        if rows is None or self._interrupted():
            return  # (the engine is waiting: the stale sequences go after its answer)
        read_s = time.perf_counter() - t_read
        self._clear_stale()  # (before the branches take sequences: after the read, not before it)
        verify_t0, read_t0 = getattr(self.target, "started", 0.0), getattr(self.ctx, "started", 0.0)
        if 0.0 < verify_t0 <= read_t0:  # how long after the verify began the worker's first decode did
            self.meter.branches.add_first_decode((read_t0 - verify_t0) * 1e3)
        shape = self.drafter.shape  # a constraint's shaping: the candidates only what the target may draw
        if shape is not None:
            for j, r in enumerate(rows):
                shape(r, history, draft.tokens[:j] if new else draft.tokens)
        # only the last draft token is new to a model draft: its row gives the bonus candidates
        cands = [top_candidates(r, temp) for r in rows] if new else cands[:k] + [top_candidates(rows[0], temp)]
        # the tree: the planner's width of the ranked outcomes, grown together (what the verify can hide)
        plan = rank_outcomes(draft.tokens, cands, self._policy.p_accept, fanout=max(1, self._policy.width),
                             min_confidence=self.cfg.min_confidence, budget_cells=self.cfg.budget_cells,
                             cells_per_branch=depth,
                             coupled=None if self.drafter.sampling.greedy else (self.drafter.seed, len(history)))
        self._planned = {(o.a, o.b) for o in plan}
        # published: an outcome outside the plan is a miss the engine tells without asking (lookup())
        self.handoff.ranked = Ranked(self._round_no, self.base, frozenset(self._planned))
        if not plan:
            return
        n = len(history)
        main = self.drafter.kv.seq
        branches = []
        for i, o in enumerate(plan):
            if not self.free_seqs:
                break
            seq = self.free_seqs.pop()
            self.ctx.seq_cp(main, seq, 0, n + o.a)  # shares the cells of C + d[:a]: metadata only
            # the likeliest to depth, the others as deep as the planner's tree allows
            br = Branch(o.a, o.b, seq, pos=n + o.a, feed=o.b,
                        depth=depth if i == 0 else min(depth, self._policy.short or depth))
            if shape is not None:  # the branch's own grammar state, after C + d[:a] + [b]
                br.shape = shape.fork(history, (*draft.tokens[:o.a], o.b))
            self.cache.put(br)
            branches.append(br)
        # the time from the verify's start to the first step, less the read's decode: the message's way
        # here, the ranking, the branches' setup (the planner prices the tree with it)
        self.handoff.steps.append((0, (time.perf_counter() - sent - read_s) * 1e3))
        try:
            if not self._grow(branches):
                return
        except Aborted:
            return
        finally:
            self.handoff.growing = None
        # published: the engine may hand these over without asking (lookup())
        self.handoff.ready = Ready(self._round_no, self.base, {(br.a, br.b): br for br in branches if br.done})

    def _grow(self, branches: list[Branch]) -> bool:
        """Draft each branch to its depth, one batch per step. False if interrupted."""
        drafter = self.drafter
        while True:
            live = [br for br in branches if not br.done]
            if not live:
                return True
            if self._stop_reading():
                return False
            feeds, positions, seqs = [br.feed for br in live], [br.pos for br in live], [br.seq for br in live]
            # The engine may abort this decode once it asks (each branch keeps what it holds), but not when
            # it looks up an outcome the decode finishes, or the one outcome of a one-row decode (the
            # extension would decode the same)
            self.handoff.growing = Growing(self.base, frozenset(
                (br.a, br.b) for br in live if len(live) == 1 or len(br.tokens) + 1 >= br.depth))
            t0 = time.perf_counter()
            if drafter.reads_heads:  # only the rows' heads cross (where the backend makes them: decode_heads)
                heads = decode_heads(self.ctx, feeds, positions, seqs, range(len(live)), self._head_width)
                toks, cands, top1 = drafter.picks(heads, [p + 1 for p in positions])
                picked = [None if top1 is not None and float(top1[i]) < drafter.p_min else (toks[i], cands[i])
                          for i in range(len(live))]
            else:  # the rows are read here and dropped (views of the context's buffer, valid until its next decode)
                rows = self.ctx.decode(feeds, positions, seqs, list(range(len(live))), copy=False)
                picked = [br.pick(drafter, row) for br, row in zip(live, rows)]
            for br, got in zip(live, picked):
                br.step(got)
            self.meter.branches.add_prepared(sum(got is not None for got in picked))
            self.meter.branches.set_cells(self.cache.cells())
            self.handoff.steps.append((len(live), (time.perf_counter() - t0) * 1e3))

    def _finish(self) -> None:
        """Drop branches and move the main sequence back to 0 for the next generation."""
        try:
            self._drop_branches()
            self._clear_stale()
            self.drafter.kv.move_to(0)
        except BaseException as e:  # pragma: no cover - reported at the next use
            self.error = e
