"""Stats, the typed record of one generation: built once by the meter, frozen,
and serialized by to_dict() with exactly the keys that the JSON outputs
(`generate --json`, bench.json, the server) carried when stats were a dict."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from ssd_edge.events import AutoStats, Round, Stats
from ssd_edge.metrics import BranchTally, Meter, decode_rate
from ssd_edge.stats_text import stats_line

# The keys of FinishEvent.stats before it was typed (Meter.stats()'s dict plus the engine's "seed" and,
# in mode auto, "auto"): JSON consumers read these.
OLD_KEYS = {
    "mode", "prompt_tokens", "tokens", "rounds", "wall_s", "ttft_s", "tokens_per_s", "end_to_end_tokens_per_s",
    "drafted", "accepted", "acceptance_rate", "mean_accepted_len", "per_position_acceptance", "draft_busy_s",
    "target_busy_s", "draft_util", "target_util", "latency_ms_p50", "latency_ms_p95", "prespec", "speculators",
    "seed",
}
NEW_KEYS = {"first_round_tokens", "draft_load_s", "memory", "in_decode_s", "positions", "host_ms_per_position",
            "devices", "native", "forced", "host_by_worker", "threads"}  # added since; old readers ignore them
OLD_PRESPEC_KEYS = {
    "lookups", "hits", "partial_hits", "misses", "hit_rate", "partial_rate", "health", "latency_ms_hit_p50",
    "latency_ms_hit_p95", "latency_ms_miss_p50", "latency_ms_miss_p95", "prepared_tokens", "used_tokens", "waste",
    "branch_cells_peak", "budget_cells", "branch_bytes_peak", "budget_bytes",
}
# What mode auto's strategy reports (planner.report() plus "concurrent"), as the engine passes it on.
REPORT = {"decisions": {"plain": 3, "prepared": 2}, "draft_alpha": [0.7, 0.6], "draft_alpha_measured": [0.75, None],
          "ngram_alpha": [0.3, 0.2], "step_ms": 40.0, "verify_ms": {1: 40.0, 2: 52.0, 3: 60.0},
          "draft_step_ms": 9.0, "contention": 1.1, "prepared_hit_rate": 0.5, "rounds": [[0, "plain", 0]],
          "concurrent": True}


def ssd_meter() -> Meter:
    """A meter that saw a prompt round, a pre-speculation hit and a miss."""
    m = Meter("ssd", 3, budget_cells=64)
    m.n_prompt, m.cell_bytes = 12, 1024
    m.first_token()
    m.record(Round(0, "ssd", "none", None, 0, 0, 300.0, 290.0, 0.0), 1)
    m.record(Round(1, "ssd", "prespec", "hit", 3, 3, 100.0, 80.0, 0.0), 4)
    m.record(Round(2, "ssd", "draft", "miss", 3, 1, 150.0, 80.0, 40.0), 2)
    m.branches.add_prepared(6)
    m.branches.add_used(3)
    m.branches.set_cells(9)
    m.branches.add_miss("wrong-token")
    m.branches.add_lookup(3, True, 4)
    m.branches.add_lookup(1, False, 2)
    return m


def test_to_dict_has_the_old_keys_and_the_new_ones():
    stats = ssd_meter().stats(seed=7)
    d = stats.to_dict()
    assert set(d) == OLD_KEYS | NEW_KEYS
    assert set(d["prespec"]) == OLD_PRESPEC_KEYS | {"miss_reasons", "hits_by_accepted", "complete_at_lookup",
                                               "first_decode_ms_p50", "first_decode_ms_p90"}
    assert d["prespec"]["hits_by_accepted"] == {"1": [1, 0], "3": [1, 1]}  # (JSON keys: strings)
    assert d["prespec"]["complete_at_lookup"] == pytest.approx(3.0)
    assert d["seed"] == 7 and d["prespec"]["hits"] == 1 and d["prespec"]["misses"] == 1
    assert d["prespec"]["branch_bytes_peak"] == 9 * 1024 and d["prespec"]["waste"] == pytest.approx(0.5)
    assert d["speculators"] == {"none": 1, "prespec": 1, "draft": 1}
    assert d["prespec"]["miss_reasons"] == {"wrong-token": 1}  # the worker's word for the one miss
    assert d["per_position_acceptance"] == [1.0, 0.5, 0.5]  # position 0 accepted twice, 1 and 2 once, of 2
    assert json.loads(json.dumps(d)) == d  # plain JSON all through


def test_auto_adds_its_report_back_unchanged():
    stats = ssd_meter().stats(auto=REPORT)
    assert isinstance(stats.auto, AutoStats)
    assert stats.auto.decisions == {"plain": 3, "prepared": 2} and stats.auto.concurrent
    assert stats.auto.planner["draft_alpha_measured"] == [0.75, None]
    d = stats.to_dict()
    assert set(d) == OLD_KEYS | NEW_KEYS | {"auto"}
    assert d["auto"] == REPORT
    assert json.loads(json.dumps(d))["auto"]["verify_ms"] == {"1": 40.0, "2": 52.0, "3": 60.0}  # as json.dumps had it


def test_attributes_are_the_dict_values():
    stats = ssd_meter().stats(seed=None)
    d = stats.to_dict()
    for f in dataclasses.fields(Stats):
        if f.name not in ("prespec", "speculators", "per_position_acceptance", "auto", "host_by_worker", "threads"):
            assert d[f.name] == getattr(stats, f.name), f.name
    assert d["host_by_worker"] == {w: list(sp) for w, sp in stats.host_by_worker.items()}
    assert d["threads"] == [dataclasses.asdict(t) for t in stats.threads]
    assert stats.seed is None and stats.auto is None and stats.prespec.hit_rate == 0.5
    assert stats.prespec.health == "fair"  # 0.5: not below HIT_RATE_POOR


def test_threads_count_each_splits_rounds_and_time_its_plain_steps_after_the_prompt():
    m = Meter("auto", 3)
    m.record(Round(0, "ar", "none", None, 0, 0, 300.0, 290.0, 0.0, threads=(2, 2)), 1)  # the prompt: not timed
    m.record(Round(1, "ar", "none", None, 0, 0, 90.0, 80.0, 0.0, steps=2, threads=(2, 2)), 2)
    m.record(Round(2, "sd", "draft", None, 3, 3, 150.0, 100.0, 40.0, threads=(2, 2)), 4)  # drafted: not a plain step
    m.record(Round(3, "ar", "none", None, 0, 0, 60.0, 50.0, 0.0, threads=(1, 1)), 1)
    stats = m.stats()
    assert [(t.target, t.draft, t.rounds, t.steps, t.ms_per_step) for t in stats.threads] == \
        [(2, 2, 3, 2, 40.0), (1, 1, 1, 1, 50.0)]
    assert stats.to_dict()["threads"][1] == {"target": 1, "draft": 1, "rounds": 1, "steps": 1, "ms_per_step": 50.0}
    assert m.live().threads == (1, 1)
    assert "2+2: 3 rounds, 2 steps at 40 ms · 1+1: 1 rounds, 1 steps at 50 ms" in stats_table_text(stats)


def stats_table_text(stats: Stats) -> str:
    from rich.console import Console

    from ssd_edge.stats_text import stats_table

    console = Console(width=200, record=True)
    console.print(stats_table(stats))
    return console.export_text()


def test_stats_are_frozen():
    stats = ssd_meter().stats(auto=REPORT)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.tokens = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.prespec.hits = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        stats.speculators["none"] = 9  # type: ignore[index]
    with pytest.raises(TypeError):
        stats.auto.decisions["plain"] = 0  # type: ignore[index,union-attr]


def test_decode_rate_leaves_out_the_first_round():
    # 7 tokens in 2.0 s; the first round (1 token, with the prompt) took 0.5 s: 6 tokens in 1.5 s
    assert decode_rate(7, 1, 2.0, 0.5) == pytest.approx(4.0)
    # a reply that ended in its first round has only its end-to-end rate
    assert decode_rate(3, 3, 0.6, 0.59) == pytest.approx(5.0)
    assert decode_rate(0, 0, 0.1, None) == 0.0


def test_meter_and_stats_agree_on_decode_time_and_rate():
    stats = ssd_meter().stats()
    assert stats.decode_s == pytest.approx(stats.wall_s - stats.ttft_s)
    assert stats.tokens_per_s == pytest.approx(decode_rate(7, 1, stats.wall_s, stats.ttft_s))
    assert stats.end_to_end_tokens_per_s == pytest.approx(7 / stats.wall_s)
    assert stats.first_round_tokens == 1 and stats.decoded


def test_a_reply_with_nothing_after_its_first_round_has_no_decode_speed():
    """A one-token answer: the first round emits it, the next verifies the end of text and emits
    nothing. Two rounds, but no decode: tokens_per_s is the end-to-end rate, and `decoded` says so."""
    m = Meter("ar", 0)
    m.first_token()
    m.record(Round(0, "ar", "none", None, 0, 0, 400.0, 400.0, 0.0), 1)
    m.record(Round(1, "ar", "none", None, 0, 0, 30.0, 30.0, 0.0), 0)
    stats = m.stats()
    assert stats.rounds == 2 and stats.tokens == stats.first_round_tokens == 1
    assert not stats.decoded and stats.tokens_per_s == stats.end_to_end_tokens_per_s


def test_stats_line_counts_one_token_and_gives_no_speed_for_none():
    one = Meter("ar", 0)
    one.first_token()
    one.record(Round(0, "ar", "none", None, 0, 0, 400.0, 400.0, 0.0), 1)
    assert stats_line(one.stats()).plain.startswith("1 token · — tok/s · ")
    assert stats_line(Meter("ar", 0).stats()).plain == "0 tokens · mode ar"
    assert stats_line(ssd_meter().stats()).plain.startswith("7 tokens · ")


def test_stats_line_says_what_auto_ran_over_the_answer_not_its_last_round():
    m = Meter("auto", 0)
    m.first_token()
    m.record(Round(0, "ar", "none", None, 0, 0, 400.0, 400.0, 0.0), 1)
    for i in range(1, 8):
        m.record(Round(i, "ar", "none", None, 0, 0, 40.0, 40.0, 0.0), 1)
    m.record(Round(8, "sd", "draft", None, 3, 3, 90.0, 60.0, 30.0), 4)
    m.record(Round(9, "sd", "draft", None, 3, 1, 90.0, 60.0, 30.0), 2)
    line = stats_line(m.stats(auto=REPORT), state="sd").plain
    assert line.endswith("mode auto: ar 80%, sd 20%")  # not "mode auto (sd)", the last round's
    assert stats_line(ssd_meter().stats(), state="rolled-back").plain.endswith("mode ssd (rolled-back)")


def test_branch_tally_counts_what_two_threads_write_while_a_third_reads():
    """The worker writes the tally while the engine reads it for its gauges: no count is lost,
    and every reading is consistent (the peak is never below the cells held)."""
    tally = BranchTally()
    readings = []

    def write() -> None:
        for i in range(2000):
            tally.add_prepared(1)
            tally.set_cells(i % 50)
            if i % 2:
                tally.add_used(1)

    writers = [threading.Thread(target=write) for _ in range(2)]
    for w in writers:
        w.start()
    while any(w.is_alive() for w in writers):
        readings.append(tally.read())
    for w in writers:
        w.join()
    assert tally.read()[:2] == (4000, 2000) and tally.read()[3] == 49
    assert all(cells <= peak and used <= prepared for prepared, used, cells, peak in readings)


def test_host_time_is_the_wall_outside_this_threads_decodes_per_row():
    """Stats.host_ms_per_position: the wall time less what this thread spent inside decodes since the
    meter started, over the rows those decodes returned; another thread's decodes are not this one's."""
    import threading
    import time

    from ssd_edge.interface import DECODES

    DECODES.add(5.0, 100)  # before the generation: not counted
    m = Meter("ar", None)
    DECODES.add(0.010, 4)
    other = threading.Thread(target=DECODES.add, args=(9.0, 1000))
    other.start()
    other.join()
    time.sleep(0.03)
    stats = m.stats()
    assert stats.positions == 4 and stats.in_decode_s == pytest.approx(0.010)
    assert stats.host_ms_per_position == pytest.approx((stats.wall_s - 0.010) / 4 * 1e3)
    assert stats.host_ms_per_position > (0.03 - 0.010) / 4 * 1e3 * 0.9
    assert Meter("ar", None).stats().host_ms_per_position is None  # no decode, no figure


def test_host_time_splits_by_what_the_worker_did_beside_each_round():
    """Stats.host_by_worker: each round's host share (since the round before) under what the worker
    grew beside its verify: nothing (alone), one branch, a tree; the parts add up to the whole."""
    import time

    from ssd_edge.interface import DECODES

    m = Meter("ssd", 3)
    for i, (beside, host_s) in enumerate([(0, 0.004), (1, 0.002), (9, 0.012), (9, 0.012)]):
        time.sleep(host_s)
        DECODES.add(0.001, 5)  # counted as this thread's decode time (not slept: the host share is 1 ms less)
        m.record(Round(i, "ssd", "prespec", "hit", 4, 4, 1.0, 1.0, 0.0, beside=beside), 5)
    stats = m.stats()
    by = stats.host_by_worker
    assert list(by) == ["alone", "branch", "tree"] and [n for _, n in by.values()] == [5, 5, 10]
    assert by["tree"][0] > (0.024 - 0.002) * 0.9 and by["alone"][0] > (0.004 - 0.001) * 0.9
    assert sum(s for s, _ in by.values()) <= stats.wall_s - stats.in_decode_s
    assert json.loads(json.dumps(stats.to_dict()))["host_by_worker"]["tree"][1] == 10
    from rich.console import Console

    from ssd_edge.stats_text import stats_table

    console = Console(width=200, record=True)
    console.print(stats_table(stats))
    text = console.export_text()
    assert "host per position, by worker" in text and "tree " in text


def test_devices_are_in_the_stats_the_line_the_table_and_the_metrics():
    """Where each model ran (Engine.devices, from ModelInfo.device): in Stats and its JSON, the stats
    line (one 'on CPU' where both run there), the stats table, and /metrics' ssd_edge_model_device."""
    from ssd_edge.interface import ModelInfo
    from ssd_edge.server.monitor import Monitor
    from ssd_edge.stats_text import stats_table

    def info(gpu_layers: int) -> ModelInfo:
        return ModelInfo(path="/m.gguf", description="1B Q4_0", n_params=1, size_bytes=1, n_vocab=1, n_layer=28,
                         n_ctx_train=1, gpu_layers=gpu_layers, kv_bytes_per_cell=1)

    assert info(0).device == "CPU" and info(29).device == "GPU 29/29 layers" and info(10).device == "GPU 10/29 layers"
    on_cpu = ssd_meter().stats(devices={"target": "CPU", "draft": "CPU"})
    assert on_cpu.to_dict()["devices"] == {"target": "CPU", "draft": "CPU"}
    assert " · on CPU" in stats_line(on_cpu).plain
    split = ssd_meter().stats(devices={"target": info(29).device, "draft": "CPU"})
    assert " · target on GPU 29/29 layers, draft on CPU" in stats_line(split).plain
    assert ssd_meter().stats().devices is None and " on CPU" not in stats_line(ssd_meter().stats()).plain
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(stats_table(split))
    assert "target on GPU 29/29 layers, draft on CPU" in console.export_text()
    from ssd_edge.events import FinishEvent

    mon = Monitor()
    mon.finish(FinishEvent("", (1,), "length", split), prompt_tokens=3)
    text = mon.exposition().decode()
    assert 'ssd_edge_model_device{device="GPU 29/29 layers",role="target"} 1.0' in text
    assert 'ssd_edge_model_device{device="CPU",role="draft"} 1.0' in text
    mon.finish(FinishEvent("", (1,), "length", on_cpu), prompt_tokens=3)  # the target moved: one series a role
    text = mon.exposition().decode()
    assert 'device="GPU 29/29 layers"' not in text and 'ssd_edge_model_device{device="CPU",role="target"} 1.0' in text
