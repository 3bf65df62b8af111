"""memory.py: llama.cpp's log lines read as buffers by part, on the host and on a device."""

from __future__ import annotations

import pytest

from ssd_edge.memory import MIB, Buffers, MemoryUse, ModelCost, fit_budget, human_bytes, parse_buffers, parse_size, rss_bytes

# what llama.cpp 0.3.36 logs (captured from the default target on this CPU, and a CUDA build's lines)
CPU_LOAD = ["load_tensors:   CPU_Mapped model buffer size =   400.86 MiB\n",
            "load_tensors:   CPU_REPACK model buffer size =   191.95 MiB\n",
            "load_tensors: layer   0 assigned to device CPU, is_swa = 0\n"]
CPU_CONTEXT = ["llama_context:        CPU  output buffer size =     0.58 MiB\n",
               "llama_kv_cache:        CPU KV buffer size =    25.50 MiB\n",
               "sched_reserve:        CPU compute buffer size =   302.00 MiB\n"]
GPU_LOAD = ["load_tensors: offloaded 29/29 layers to GPU\n",
            "load_tensors:        CUDA0 model buffer size =   934.12 MiB\n",
            "load_tensors:   CPU_Mapped model buffer size =   125.20 MiB\n"]
GPU_CONTEXT = ["llama_kv_cache:      CUDA0 KV buffer size =   112.00 MiB\n",
               "llama_context:  CUDA_Host  output buffer size =     0.58 MiB\n",
               "sched_reserve:      CUDA0 compute buffer size =   299.75 MiB\n",
               "sched_reserve:  CUDA_Host compute buffer size =    11.01 MiB\n"]


def mib(x: float) -> int:
    return int(round(x * MIB))


def test_a_cpu_load_and_context():
    assert parse_buffers(CPU_LOAD) == Buffers(weights=mib(400.86) + mib(191.95))
    assert parse_buffers(CPU_CONTEXT) == Buffers(kv=mib(25.50), compute=mib(302.00) + mib(0.58))


def test_device_buffers_are_counted_apart_and_pinned_host_memory_is_host():
    load, ctx = parse_buffers(GPU_LOAD), parse_buffers(GPU_CONTEXT)
    assert load == Buffers(weights=mib(934.12) + mib(125.20), on_device=mib(934.12))
    assert ctx.on_device == mib(112.00) + mib(299.75)  # CUDA_Host: pinned host memory, not the GPU's
    assert (load + ctx).weights == load.weights and (load + ctx).kv == mib(112.00)


def test_lines_without_buffers_give_nothing():
    assert parse_buffers(["llama_context: n_ctx = 4096\n", ""]) == Buffers()


def test_memory_use_sums_and_describes_its_parts():
    m = MemoryUse(target_weights=mib(1660), draft_weights=0, target_kv=mib(112), draft_kv=0, compute=mib(303),
                  on_device=0, other=mib(60), rss=mib(1900))
    assert m.total == mib(1660 + 112 + 303 + 60)
    assert m.to_dict()["total"] == m.total
    line = m.describe()
    assert line.startswith("2.08 GiB: 1.62 GiB target weights · 112 MiB target KV · 303 MiB compute · 60 MiB other")
    assert "draft" not in line and "RSS now 1.86 GiB" in line


def test_human_bytes():
    assert [human_bytes(x) for x in (512, 1536, 150 * MIB, 2.5 * 1024 * MIB)] == ["512 B", "1.5 KiB", "150 MiB",
                                                                                   "2.5 GiB"]


def test_rss_is_read():
    assert rss_bytes() > 10 * MIB


# ---------------------------------------------------------------- --memory-budget

# the default pair as this CPU allocates it (weights: llama.cpp's buffers; f16 bytes per KV cell)
TARGET = ModelCost(weights=1_736_882_258, f16_cell=28_672, n_vocab=151_936)
DRAFT = ModelCost(weights=621_606_338, f16_cell=12_288, n_vocab=151_936)


def fit(budget: str, draft: ModelCost | None = DRAFT, required: bool = False, n_ctx: int = 32768, kv: str = "f16"):
    return fit_budget(parse_size(budget), base=60 * MIB, target=TARGET, draft=draft, n_ctx=n_ctx, n_batch=512,
                      kv=kv, budget_cells=256, draft_extra=48, draft_required=required)


def test_parse_size():
    assert parse_size("3G") == 3 << 30 and parse_size("512M") == 512 << 20 and parse_size("2.5GiB") == 5 << 29
    assert parse_size("800mb") == 800 << 20 and parse_size("1048576") == 1 << 20
    for bad in ("x3", "", "-1G", "0", "3Q"):
        with pytest.raises(ValueError, match="is not a size"):
            parse_size(bad)


def test_a_budget_that_fits_changes_nothing():
    plan = fit("8G")
    assert (plan.n_ctx, plan.kv, plan.budget_cells, plan.draft, plan.changes) == (32768, "f16", 256, True, ())
    assert plan.needs <= 8 << 30


def test_the_context_shrinks_first_then_the_kv_type_then_the_cells_then_the_draft():
    """Lowering the budget 2 MiB at a time from 5 GiB walks the whole ladder, in order, each plan
    within its budget; without the draft the target gets its context back, then shrinks again."""
    seen: list[tuple] = []
    for mib_ in range(5000, 2000, -2):
        try:
            p = fit(f"{mib_}M")
        except ValueError:
            seen.append(("refused",))
            break
        assert p.needs <= mib_ * MIB
        key = (p.n_ctx, p.kv, p.budget_cells, p.draft)
        if not seen or seen[-1] != key:
            seen.append(key)
    assert seen == [(32768, "f16", 256, True), (16384, "f16", 256, True), (8192, "f16", 256, True),
                    (4096, "f16", 256, True), (2048, "f16", 256, True), (2048, "q8_0", 256, True),
                    (2048, "q4_0", 256, True), (2048, "q4_0", 0, True),
                    (32768, "f16", 0, False), (16384, "f16", 0, False), (8192, "f16", 0, False),
                    (4096, "f16", 0, False), (2048, "f16", 0, False), (2048, "q8_0", 0, False),
                    (2048, "q4_0", 0, False), ("refused",)]
    assert fit("4G").describe(4 << 30) == ("--memory-budget 4 GiB: about 3.48 GiB with a context of 16384 tokens "
                                           "(from 32768)")
    assert fit("2.6G").changes == ("a context of 16384 tokens (from 32768)", "no draft model")


def test_a_mode_that_needs_the_draft_keeps_it_or_refuses():
    with pytest.raises(ValueError, match="too small for this mode's two models"):
        fit("2.6G", required=True)
    assert fit("3G", required=True).draft


def test_refuses_in_one_line_when_the_target_alone_cannot_fit():
    with pytest.raises(ValueError) as e:
        fit("1G")
    assert "\n" not in str(e.value) and "the target alone needs about 1.99 GiB" in str(e.value)


def test_a_small_context_asked_is_never_grown_and_a_quantized_kv_asked_is_kept():
    plan = fit("2.1G", draft=None, n_ctx=1024, kv="q8_0")
    assert plan.n_ctx == 1024 and plan.kv == "q8_0"
