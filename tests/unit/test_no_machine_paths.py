"""No tracked file names the machine it was made on: every file `git ls-files` lists (binary files
skipped) is read for
  - an absolute home path (the root user's, or a user's under home or Users): write it ~-relative;
  - the workspace (the work folder at the root): write it relative to the repository, or name the file;
  - a file or folder under /tmp: a scratch path means nothing on another machine;
  - this machine's host name as a machine writes it: a quoted value (bench.json's "hostname"),
    user@HOST, HOST:PORT, //HOST, or after the word hostname. A bare word is not enough: a host
    called "runner" would otherwise fail on every mention of the server's runner.
Each finding names the file, the line and what was found. The check is shown failing on files
fabricated in a throwaway git repository (the tests at the bottom)."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A path starts the token it is in: a URL's path (https://github.com/root/...) or a relative one
# (docs/work/...) has a word character, a dot, a slash or a tilde before its slash.
_START = r"(?<![\w.~/-])"
PATHS = [
    ("a home folder", re.compile(_START + r"/(?:root|home/[\w.-]+|Users/[\w.-]+)/")),
    ("the workspace", re.compile(_START + r"/(?:work)/")),
    ("a path under /tmp", re.compile(_START + r"/tmp/[\w.-]")),
]
GENERIC_HOSTS = {"", "localhost", "localhost.localdomain"}
BINARY_PROBE = 8192  # a NUL byte in a file's first 8 KiB marks it binary, as git's own heuristic does


def host_patterns(hostname: str) -> list[re.Pattern[str]]:
    """How a host name gets written into files: quoted, user@host, host:port, //host, hostname: host.
    For a dotted name both the whole name and its first label are looked for."""
    names = {hostname, hostname.split(".")[0]} - GENERIC_HOSTS
    patterns = []
    for name in sorted(names):
        h = re.escape(name)
        end = r"(?![\w-])"
        patterns.append(re.compile(rf"""["']{h}["']|@{h}{end}|(?<![\w.-]){h}:\d|//{h}{end}"""
                                   rf"""|hostname\W{{1,4}}{h}{end}""", re.IGNORECASE))
    return patterns


def tracked_files(repo: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def text_of(path: Path) -> str | None:
    """The file's text (bytes that are not UTF-8 replaced), or None for a binary file or one that is gone."""
    if not path.is_file():
        return None
    data = path.read_bytes()
    if b"\0" in data[:BINARY_PROBE]:
        return None
    return data.decode("utf-8", errors="replace")


def machine_paths(repo: Path, hostname: str) -> list[str]:
    """'file:line: what: the match' for every machine path or host name in repo's tracked files."""
    checks = PATHS + [("this machine's host name", p) for p in host_patterns(hostname)]
    found = []
    for name in tracked_files(repo):
        text = text_of(repo / name)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            for what, pattern in checks:
                m = pattern.search(line)
                if m:
                    # a path as written, to its next space; a host name with what marks it as one
                    shown = m.group(0) if any(c.isspace() for c in m.group(0)) else line[m.start():].split()[0]
                    found.append(f"{name}:{number}: {what}: {shown[:80]}")
    return found


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@needs_git
def test_no_tracked_file_names_this_machine():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    found = machine_paths(ROOT, socket.gethostname())
    assert not found, "machine paths in tracked files:\n" + "\n".join(found)


# ---------------------------------------------------------------- the check, failing on fabricated files

def fabricated_repo(tmp_path: Path, files: dict[str, bytes], untracked: dict[str, bytes]) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    for name, data in {**files, **untracked}.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(data)
    subprocess.run(["git", "add", "--", *files], cwd=repo, check=True)
    return repo


HOME = "/" + "root/"  # spelt in two parts so that this file does not name a home itself
USER_HOME = "/" + "home/alice/"
MAC_HOME = "/" + "Users/alice/"
WORK = "/" + "work/"
TMP = "/" + "tmp/"


@needs_git
def test_each_kind_of_machine_path_is_found_with_its_file_and_line(tmp_path):
    repo = fabricated_repo(tmp_path, files={
        "clean.md": b"models live in ~/.cache/ssd-edge/models; see https://github.com/root/x and docs/work/y\n",
        "bench.json": f'{{\n "path": "{HOME}.cache/m.gguf",\n "hostname": "buildbox-7"\n}}\n'.encode(),
        "notes/run.md": f"one\nran {USER_HOME}src/x.py\nthen {MAC_HOME}x, {WORK}main/.venv, {TMP}bench_full\n".encode(),
        "ssh.txt": b"ssh alice@buildbox-7 and buildbox-7:50052\n",
    }, untracked={"scratch.txt": f"{HOME}never listed\n".encode()})
    found = machine_paths(repo, "buildbox-7")
    assert [f.split(": ")[0] for f in found] == [
        "bench.json:2", "bench.json:3", "notes/run.md:2", "notes/run.md:3", "notes/run.md:3", "notes/run.md:3",
        "ssh.txt:1"]  # clean.md and the untracked scratch.txt say nothing; one finding per check and line
    assert "a home folder" in found[0] and "this machine's host name" in found[1]
    assert any("the workspace" in f for f in found) and any("a path under /tmp" in f for f in found)


@needs_git
def test_binary_files_are_skipped_text_in_another_encoding_is_read(tmp_path):
    repo = fabricated_repo(tmp_path, files={
        "plot.png": b"\x89PNG\r\n\x1a\n\0\0" + HOME.encode() + b"x",
        "latin1.txt": "caf\xe9 ".encode("latin-1") + HOME.encode() + b"x\n",
        "server.py": b'print("served on localhost:8080 by the runner")\n',
    }, untracked={})
    assert [f.split(": ")[0] for f in machine_paths(repo, "localhost")] == ["latin1.txt:1"]
    assert [f.split(": ")[0] for f in machine_paths(repo, "runner")] == ["latin1.txt:1"]  # a bare word
    # is not a host name written by a machine, and localhost is no machine's own


def test_a_host_name_is_found_where_machines_write_it():
    host = "example-vm"  # not this machine's name: this file is scanned too
    (pattern,) = host_patterns(host)
    for line in [f'"hostname": "{host}"', f"alice@{host}:~$", f"{host}:50052", f"http://{host}/x", f"hostname {host}"]:
        assert pattern.search(line), line
    for line in [f"an {host} image", "the EXAMPLE-VMs", f"my{host}:12", f"{host}-2:12"]:
        assert not pattern.search(line), line
    assert len(host_patterns("box.example.org")) == 2 and host_patterns("localhost") == []
