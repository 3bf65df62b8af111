"""The Backend protocol (ssd_edge/interface.py): the llama.cpp adapter and the fake
backend both implement it, and the engine, the faces and the measurers import
without llama-cpp-python."""

from __future__ import annotations

import inspect
import subprocess
import sys
import typing

import pytest

from fakes import FakeAbort, FakeContext, FakeModel
from ssd_edge.interface import AbortSignal, BackendContext, BackendModel
from ssd_edge.llama import backend

PROTOCOLS = [(BackendModel, backend.Model), (BackendContext, backend.Context), (AbortSignal, backend.AbortFlag)]


def members(proto: type) -> tuple[set[str], set[str]]:
    """(methods, data attributes) that the protocol declares."""
    methods = {n for n, v in vars(proto).items() if inspect.isfunction(v) and not n.startswith("_")}
    return methods, set(typing.get_type_hints(proto))


def test_the_fake_backend_implements_the_protocol():
    model = FakeModel()
    assert isinstance(model, BackendModel)
    assert isinstance(FakeContext(model), BackendContext)
    assert isinstance(FakeAbort(), AbortSignal)


@pytest.mark.parametrize("proto, impl", PROTOCOLS, ids=lambda x: x.__name__)
def test_the_llama_backend_implements_the_protocol(proto, impl):
    """Checked on the classes, without loading a model: methods are class attributes, data
    attributes are assigned in __init__."""
    methods, data = members(proto)
    assert methods and all(callable(getattr(impl, m, None)) for m in methods), methods - set(dir(impl))
    init = inspect.getsource(impl.__init__)
    missing = {d for d in data if f"self.{d} =" not in init and f"self.{d}," not in init}
    assert not missing, f"{impl.__name__}.__init__ does not set {missing}"


def test_the_engine_and_the_faces_import_without_llama_cpp():
    """llama_cpp is blocked outright; everything but loading a model must still import."""
    code = ("import sys; sys.modules['llama_cpp'] = None\n"
            "import ssd_edge.engine, ssd_edge.bench.calibrate, ssd_edge.bench.run, ssd_edge.cli.commands\n"
            "import ssd_edge.server.runner, ssd_edge.llama.backend, tui.app\n"
            "from ssd_edge.llama.backend import llama_cpp_version; print(llama_cpp_version())\n"
            "try:\n    ssd_edge.llama.backend.system_info()\nexcept ImportError as e:\n    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == "llama-cpp-python is not installed; run scripts/setup.sh"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_the_console_script_loads_libllama_before_numpy():
    """`ssd-edge` opens llama.cpp's library before the first import of numpy (cli/entry.py): on a CUDA
    machine the other order crashed the first model load (FIELD_NOTES)."""
    pytest.importorskip("llama_cpp")
    code = (
        "import sys\n"
        "class Watch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'numpy' and not hasattr(self, 'seen'):\n"
        "            self.seen = any('libllama' in line for line in open('/proc/self/maps'))\n"
        "            print('libllama loaded before numpy:', self.seen)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Watch())\n"
        "sys.argv = ['ssd-edge', '--help']\n"
        "from ssd_edge.cli.entry import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = p.stdout.splitlines()
    assert "libllama loaded before numpy: True" in lines and lines[-1] == "exit 0", p.stdout[-2000:] + p.stderr
