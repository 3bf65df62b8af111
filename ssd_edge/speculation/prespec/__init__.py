"""SSD pre-speculation (SAGUARO): prepare the next draft while the target verifies.

While the target verifies round t (history C, draft d of k tokens), the worker
thread, which alone owns the draft context, guesses the verification outcome
(a, b): a = draft tokens accepted (0..k), b = the target's recovery token
(a < k; never d[a] itself, whose residual mass is zero) or bonus token (a = k).
For the likeliest outcomes it drafts the next round ahead of time, each in its
own sequence ("branch") of one unified-KV draft context:

    seq main :  C + d[0..k-1]                          (decoded while drafting d)
    branch s :  C + d[0..a-1] | b  e1 .. e_{k-1}       (shares C + d[:a] with main)

When the outcome arrives, the SpeculationCache answers in O(1):
    hit     : branch (a, b) is fully drafted -> handed to the target at once, without waiting
              for the worker, which makes it the main sequence after the decode it has in flight;
    partial : branch (a, b) was still growing -> its prefix is handed over; the engine's
              planner decides whether the worker drafts the rest (extend);
    miss    : no branch -> all branches dropped; the engine drafts just in time or
              uses the backup speculator. An outcome the plan never ranked is a miss the
              engine tells without waiting for the worker.
The branches grow as a tree from the first step: one per acceptance length first, together,
one batched decode a depth step (the likeliest to the full depth, the others as deep as the
planner's shape says the verify hides), within `budget_cells` KV cells; a step reads only each
row's head (sampling.Heads), made where the backend makes rows where it can (decode_heads).
When the engine asks, a branch decode in flight is aborted unless it finishes the branch looked
up (it is the hit); reading history the draft has not seen is never aborted.

    outcomes.py  which outcomes to prepare (rank_outcomes), the Branch and SpeculationCache
                 that hold them, why a lookup missed;
    worker.py    PrespecWorker: the thread, the engine's calls, the branches' growth;
    handoff.py   Handoff: all the state the engine thread and the worker thread share.

Losslessness does not depend on any of this: a prepared draft is only a
proposal, verified against the target like any other (verify.py).
"""

from .outcomes import Branch, LookupResult, Outcome, SpeculationCache, outcome_of, rank_outcomes, why_missed
from .worker import READ_CHUNK, PrespecWorker

__all__ = ["Branch", "LookupResult", "Outcome", "PrespecWorker", "READ_CHUNK", "SpeculationCache",
           "outcome_of", "rank_outcomes", "why_missed"]
