"""Whether a test of ssd_edge.native (setup.py's optional C extension) may skip for want of it.

The extension is missing only where no C compiler was there to build it. Where one is (CI, a
developer's machine), a missing extension, or one built from older C sources, is a broken build:
the tests that need it fail, saying how to build it, instead of skipping."""

from __future__ import annotations

import os
import shutil
import sysconfig

import pytest


def c_compiler() -> str | None:
    """The C compiler setup.py would build with ($CC, else the one Python was built with, else cc), or None."""
    for cc in (os.environ.get("CC", ""), sysconfig.get_config_var("CC") or "", "cc"):
        found = cc.split() and shutil.which(cc.split()[0])
        if found:
            return found
    return None


def skip_or_fail(what: str) -> None:
    """End the calling test for want of `what` from ssd_edge.native: a skip where no C compiler could have
    built it, a failure where one could."""
    compiler = c_compiler()
    if compiler is None:
        pytest.skip(f"{what} is not built here (ssd_edge.native; no C compiler to build it)")
    pytest.fail(f"{what} is not built (ssd_edge.native), though a C compiler is here ({compiler}): build it with "
                "`python setup.py build_ext --inplace` (pip install builds it too)", pytrace=False)
