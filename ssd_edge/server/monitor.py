"""Prometheus metrics of a serving engine (GET /metrics, the text exposition format).

Counters grow over the server's life; derive rates in PromQL, e.g. the pre-speculation hit rate
over five minutes:

    sum(rate(ssd_edge_prespec_lookups_total{outcome="hit"}[5m]))
      / sum(rate(ssd_edge_prespec_lookups_total[5m]))

and the draft's utilization: rate(ssd_edge_busy_seconds_total{role="draft"}[5m])
/ rate(ssd_edge_generation_seconds_total[5m]). Gauges named *_rate hold the same ratios since
start, for a quick look with curl. docs/server.md lists alert rules on the hit rate (healthy above
0.70, poor below 0.50, as events.HIT_RATE_HEALTHY / HIT_RATE_POOR).

Generation metrics are written by the scheduler's one worker thread; request counts by the
event loop. Each app has its own registry, so several servers (the tests) never share counts.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from ..events import FinishEvent, TokenEvent
from .reply import PROPOSER

CONTENT_TYPE = CONTENT_TYPE_LATEST
disable_created_metrics()  # no *_created series: they double the page and no dashboard reads them

_TOKEN_S = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
_WAIT_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_GEN_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class Monitor:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("ssd_edge_requests", "HTTP requests answered, by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.generations = Counter("ssd_edge_generations", "jobs ended, by how: eos, stop, length, context, "
                                   "prefill (a prompt read with nothing generated: n_predict 0), cancelled (client gone or shutdown), withdrawn (left the queue before it ran), "
                                   "error",
                                   ["reason"], registry=r)
        self.prompt_tokens = Counter("ssd_edge_prompt_tokens", "prompt tokens read", registry=r)
        self.completion_tokens = Counter("ssd_edge_completion_tokens", "tokens generated, by where each came "
                                         "from: target, draft, prespec (a pre-speculated branch), ngram",
                                         ["source"], registry=r)
        self.rounds = Counter("ssd_edge_rounds", "verification rounds, by the proposer that served them: plain, "
                              "ngram, draft, prepared (a pre-speculated branch)", ["proposer"], registry=r)
        self.planner = Counter("ssd_edge_auto_decisions", "mode auto: the round planner's choices, by proposer",
                               ["proposer"], registry=r)
        self.drafted = Counter("ssd_edge_draft_tokens", "drafted tokens the target verified", registry=r)
        self.accepted = Counter("ssd_edge_accepted_tokens", "drafted tokens the target accepted", registry=r)
        self.lookups = Counter("ssd_edge_prespec_lookups", "pre-speculation cache lookups, by outcome: hit, "
                               "partial, miss", ["outcome"], registry=r)
        self.token_latency = Histogram("ssd_edge_token_latency_seconds", "time per generated token (its round's "
                                       "wall time over the round's tokens), by the round's pre-speculation "
                                       "outcome: hit, partial, miss, none (no lookup)", ["prespec"],
                                       buckets=_TOKEN_S, registry=r)
        self.ttft = Histogram("ssd_edge_time_to_first_token_seconds", "from the start of a generation to its "
                              "first verified token (prompt processing included)", buckets=_WAIT_S, registry=r)
        self.duration = Histogram("ssd_edge_generation_duration_seconds", "wall time of a generation",
                                  buckets=_GEN_S, registry=r)
        self.queue_wait = Histogram("ssd_edge_queue_wait_seconds", "time a request waited for the engine",
                                    buckets=_WAIT_S, registry=r)
        self.busy = Counter("ssd_edge_busy_seconds", "compute time, by role: target, draft", ["role"], registry=r)
        self.generation_seconds = Counter("ssd_edge_generation_seconds", "wall time spent generating", registry=r)
        self.utilization = Gauge("ssd_edge_utilization", "busy fraction of the latest generation, by role",
                                 ["role"], registry=r)
        self.acceptance = Gauge("ssd_edge_acceptance_rate", "accepted / drafted tokens since start", registry=r)
        self.hit_rate = Gauge("ssd_edge_prespec_hit_rate", "pre-speculation hits / lookups since start", registry=r)
        self.tokens_per_s = Gauge("ssd_edge_tokens_per_second", "decode speed of the latest generation", registry=r)
        self.queue_depth = Gauge("ssd_edge_queue_depth", "requests waiting for the engine", registry=r)
        self.queue_capacity = Gauge("ssd_edge_queue_capacity", "requests that may wait (--max-queue)", registry=r)
        self.in_progress = Gauge("ssd_edge_generations_in_progress", "generations running (0 or 1)", registry=r)
        self.memory = Gauge("ssd_edge_memory_bytes", "memory by part at the end of the latest generation: "
                            "target_weights, draft_weights, target_kv, draft_kv (its branch cells included), "
                            "compute (both contexts' compute and output buffers), other (the process before "
                            "the models loaded), total (their sum), rss (resident now), on_device (of the "
                            "parts, what a GPU or RPC device holds)", ["part"], registry=r)
        self.device = Gauge("ssd_edge_model_device", "1 for where each model's layers ran in the latest generation "
                            "(device: CPU, 'GPU 29/29 layers', '... via RPC'), by role", ["role", "device"],
                            registry=r)
        self._drafted = self._accepted = 0
        self._lookups = self._hits = 0

    # ------------------------------------------------------------ written by the worker thread
    def token_event(self, ev: TokenEvent) -> None:
        r = ev.round  # the last of ev.rounds rounds (several: plain steps made in one call)
        self.rounds.labels(PROPOSER.get(r.speculator, r.speculator)).inc(ev.rounds)
        for source in ev.provenance:
            self.completion_tokens.labels(source).inc()
        if ev.tokens:
            per_token = ev.wall_ms / 1e3 / len(ev.tokens)
            hist = self.token_latency.labels(r.prespec or "none")
            for _ in ev.tokens:
                hist.observe(per_token)
        if r.drafted:
            self.drafted.inc(r.drafted)
            self.accepted.inc(r.accepted)
            self._drafted += r.drafted
            self._accepted += r.accepted
            self.acceptance.set(self._accepted / self._drafted)
        if r.prespec:
            self.lookups.labels(r.prespec).inc()
            self._lookups += 1
            self._hits += r.prespec == "hit"
            self.hit_rate.set(self._hits / self._lookups)
        self.utilization.labels("draft").set(ev.live.draft_util)
        self.utilization.labels("target").set(ev.live.target_util)

    def finish(self, ev: FinishEvent, prompt_tokens: int) -> None:
        st = ev.stats
        self.generations.labels(ev.stop_reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        if st.ttft_s is not None:
            self.ttft.observe(st.ttft_s)
        self.duration.observe(st.wall_s)
        self.generation_seconds.inc(st.wall_s)
        self.busy.labels("target").inc(st.target_busy_s)
        self.busy.labels("draft").inc(st.draft_busy_s)
        self.utilization.labels("draft").set(st.draft_util)
        self.utilization.labels("target").set(st.target_util)
        if ev.tokens:
            self.tokens_per_s.set(st.tokens_per_s)
        for proposer, n in (st.auto.decisions if st.auto is not None else {}).items():
            self.planner.labels(proposer).inc(n)
        for part, n in (st.memory or {}).items():
            self.memory.labels(part).set(n)
        if st.devices:
            self.device.clear()  # one series per role: where it ran last
            for role, where in st.devices.items():
                self.device.labels(role, where).set(1)

    # ------------------------------------------------------------ read by GET /metrics
    def exposition(self) -> bytes:
        return generate_latest(self.registry)
