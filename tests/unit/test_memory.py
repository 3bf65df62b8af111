"""memory.py: llama.cpp's log lines read as buffers by part, on the host and on a device."""

from __future__ import annotations

from ssd_edge.memory import MIB, Buffers, MemoryUse, human_bytes, parse_buffers, rss_bytes

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
