"""The one compiled part of ssd-edge: the module ssd_edge.native, built from ssd_edge/csrc/ (a logit row's k
largest in one pass, the sampling chain and the coupled draw, mode ar's plain steps in one call, the priced
backend's busy wait, the word that wakes SSD's draft side; csrc/native.h says which file does what).
Optional: where it does not build, sampling.top_ids takes its numpy path (the same ids, slower), the priced
backend sleeps and SSD's worker waits on its queue. Everything else is in pyproject.toml."""

import sys

from setuptools import Extension, setup

CSRC = "ssd_edge/csrc"
SOURCES = [f"{CSRC}/{name}.c" for name in ("module", "rows", "draws", "steps", "row_hook", "priced", "wake")]

setup(ext_modules=[Extension("ssd_edge.native", SOURCES, depends=[f"{CSRC}/native.h"], optional=True,
                             extra_compile_args=[] if sys.platform == "win32" else ["-O3"])])
