"""What the bench records of the machine it runs on: its CPU and cores, RAM, GPUs, OS, Python, llama.cpp's
build, the load average and the libraries' versions (schema.MachineInfo, BenchResult.libraries), and the
hardware settings its cores allow (separate, shared)."""

from __future__ import annotations

import os
import platform
from importlib import metadata

from .schema import MachineInfo, Setting


def hardware_settings(cores: int) -> dict[str, Setting]:
    half = max(1, cores // 2)
    return {
        "separate": Setting(name="separate", target_threads=half, draft_threads=max(1, cores - half),
                            description=f"target and draft each own {half} core(s): {half} thread(s) each; "
                                        "affinity left to the OS"),
        "shared": Setting(name="shared", target_threads=cores, draft_threads=cores,
                          description=f"both models use all {cores} cores ({cores} threads each); ssd oversubscribes"),
    }


def machine_info(cores: int) -> MachineInfo:
    import psutil

    from ..planning.profile import device_info
    from ..llama import backend

    dev = device_info()
    return MachineInfo(hostname=platform.node(), os=platform.platform(), machine=dev.machine, cpu=dev.cpu,
                       cores=cores, ram_gib=round(psutil.virtual_memory().total / 2**30, 1),
                       python=platform.python_version(), llama_system_info=backend.system_info().strip(), gpus=dev.gpus,
                       load_avg_start=os.getloadavg())


def library_versions() -> dict[str, str]:
    out = {}
    for name in ("ssd-edge", "llama-cpp-python", "numpy", "pydantic", "rich", "matplotlib", "psutil"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out
