"""What the bench records of the machine it runs on: its CPU and cores, RAM, GPUs, OS, Python, llama.cpp's
build, the load average and the libraries' versions (schema.MachineInfo, BenchResult.libraries), and the
hardware settings its cores allow (separate, shared).

And what it does not record: results are committed and shared, so they name no machine. No hostname is
written, and every path of this machine goes through PortablePaths: a model by its place in the models
folder, anything else under the home folder with `~`, any other absolute path by its file name alone.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from .schema import MachineInfo, Setting

# An absolute path inside a text (an error message, a command-line argument such as --output=/x): a slash
# that follows no name, dot, tilde, colon, '<' or other slash (so not "tokens/s", "~/x", "http://" or
# "</s>"), then one or more names. A name stops at a space: a path with spaces keeps its tail, never its head.
ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/<-])/[\w.+@%~-]+(?:/[\w.+@%~-]+)*")


def hardware_settings(cores: int) -> dict[str, Setting]:
    half = max(1, cores // 2)
    return {
        "separate": Setting(name="separate", target_threads=half, draft_threads=max(1, cores - half),
                            description=f"target and draft each own {half} core(s): {half} thread(s) each; "
                                        "affinity left to the OS"),
        "shared": Setting(name="shared", target_threads=cores, draft_threads=cores,
                          description=f"both models use all {cores} cores ({cores} threads each); ssd oversubscribes"),
    }


def busy_cores(seconds: float = 0.3) -> float:
    """How many of this machine's cores other work keeps busy now: the whole machine's CPU use over
    `seconds` (this process sleeps meanwhile), in cores. 0.0 where it cannot be read."""
    import psutil

    try:
        return psutil.cpu_percent(interval=seconds) / 100 * (psutil.cpu_count() or 1)
    except (OSError, RuntimeError):  # pragma: no cover - a sandbox without /proc/stat
        return 0.0


def machine_info(cores: int) -> MachineInfo:
    import psutil

    from ..llama import backend
    from ..planning.profile import device_info
    from ..sampling import native_path

    dev = device_info()
    return MachineInfo(os=platform.platform(), machine=dev.machine, cpu=dev.cpu,
                       cores=cores, ram_gib=round(psutil.virtual_memory().total / 2**30, 1),
                       python=platform.python_version(), llama_system_info=backend.system_info().strip(), gpus=dev.gpus,
                       load_avg_start=os.getloadavg(), native=native_path())


def library_versions() -> dict[str, str]:
    out = {}
    for name in ("ssd-edge", "llama-cpp-python", "numpy", "pydantic", "rich", "matplotlib", "psutil"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


@dataclass(frozen=True)
class PortablePaths:
    """This machine's paths as a result writes them: relative to the models folder when inside it, with
    the home folder as `~` when under it, else the file's name alone. A relative path is written as given."""

    models: Path                                       # the models folder (paths.models_dir)
    home: Path = field(default_factory=Path.home)

    def path(self, p: str | os.PathLike[str]) -> str:
        p = Path(p)
        if not p.is_absolute():
            return str(p)
        if p.is_relative_to(self.models.absolute()):
            return str(p.relative_to(self.models.absolute()))
        if p.is_relative_to(self.home):
            return str(Path("~") / p.relative_to(self.home))
        return p.name

    def models_of(self, config: dict) -> dict:
        """An EngineConfig's dump (model_dump) with its models' paths written as path() writes them."""
        return {**config, **{m: {**config[m], "path": self.path(config[m]["path"])}
                             for m in ("target", "draft") if config.get(m)}}

    def text(self, text: str) -> str:
        """`text` with every absolute path in it written as path() writes it."""
        return ABSOLUTE_PATH.sub(lambda m: self.path(m.group()), text)
