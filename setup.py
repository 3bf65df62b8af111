"""The one compiled part of ssd-edge: ssd_edge/native.c (a logit row's k largest in one pass; the priced
backend's busy wait). Optional: where it does not build, sampling.top_ids takes its numpy path (the same
ids, slower) and the priced backend sleeps. Everything else is in pyproject.toml."""

import sys

from setuptools import Extension, setup

setup(ext_modules=[Extension("ssd_edge.native", ["ssd_edge/native.c"], optional=True,
                             extra_compile_args=[] if sys.platform == "win32" else ["-O3"])])
