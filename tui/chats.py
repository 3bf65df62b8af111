"""Chat history on disk: one JSON file per chat under `ssd_edge.paths.chats_dir()`.

Every save rewrites the whole file atomically (a temporary file in the same
folder, then `os.replace`), so a crash or Ctrl-C leaves the previous or the
new version of a chat, never half of one. The app saves after every batch of
streamed text it shows, so what was on screen is on disk.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ssd_edge import paths

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the file layout changes


@dataclass
class Message:
    role: str                       # "user" or "assistant"
    content: str
    # assistant only: runs of [provenance, n_chars] covering `content` in order
    runs: list[list[Any]] = field(default_factory=list)
    note: str = ""                  # a line under the message: stats, "stopped", an error

    def add(self, provenance: str, text: str) -> None:
        """Append streamed text, merging it into the last run when the provenance is the same."""
        if not text:
            return
        self.content += text
        if self.runs and self.runs[-1][0] == provenance:
            self.runs[-1][1] += len(text)
        else:
            self.runs.append([provenance, len(text)])

    def spans(self) -> list[tuple[str, str]]:
        """(provenance, text) pieces of `content`; text past the runs (old files) counts as target."""
        out, pos = [], 0
        for prov, n in self.runs:
            out.append((prov, self.content[pos:pos + n]))
            pos += n
        if pos < len(self.content):
            out.append(("target", self.content[pos:]))
        return out


@dataclass
class Chat:
    id: str
    created: float
    updated: float
    system: str = ""
    title: str = ""
    messages: list[Message] = field(default_factory=list)

    def engine_messages(self) -> list[dict[str, str]]:
        """The conversation as chat messages for `Engine.generate(messages=...)`."""
        out = [{"role": "system", "content": self.system}] if self.system.strip() else []
        out += [{"role": m.role, "content": m.content} for m in self.messages if m.content]
        return out

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Chat":
        msgs = [Message(m["role"], m["content"], [list(r) for r in m.get("runs", [])], m.get("note", ""))
                for m in data.get("messages", [])]
        return cls(str(data["id"]), float(data["created"]), float(data.get("updated", data["created"])),
                   data.get("system", ""), data.get("title", ""), msgs)


@dataclass(frozen=True)
class ChatSummary:
    id: str
    title: str
    updated: float
    n_messages: int


class ChatStore:
    """The folder of saved chats. The folder is fixed when the store is made."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = Path(folder) if folder is not None else paths.chats_dir()

    def path(self, chat_id: str) -> Path:
        return self.folder / f"{chat_id}.json"

    def new(self, now: float, system: str = "") -> Chat:
        """A fresh, unsaved chat with an id made from the time (unique in the folder)."""
        stem = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        chat_id, n = stem, 1
        while self.path(chat_id).exists():
            n += 1
            chat_id = f"{stem}-{n}"
        return Chat(chat_id, now, now, system)

    def save(self, chat: Chat) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        data = json.dumps(chat.to_json(), ensure_ascii=False, indent=1)
        fd, tmp = tempfile.mkstemp(prefix=f".{chat.id}.", suffix=".tmp", dir=self.folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(data)
            os.replace(tmp, self.path(chat.id))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load(self, chat_id: str) -> Chat:
        with open(self.path(chat_id), encoding="utf-8") as f:
            return Chat.from_json(json.load(f))

    def delete(self, chat_id: str) -> None:
        self.path(chat_id).unlink(missing_ok=True)

    def list(self) -> list[ChatSummary]:
        """Saved chats, most recently updated first; unreadable files are skipped (and logged)."""
        out = []
        for p in self.folder.glob("*.json") if self.folder.is_dir() else []:
            try:
                with open(p, encoding="utf-8") as f:
                    data = json.load(f)
                out.append(ChatSummary(str(data["id"]), data.get("title", "") or "(untitled)",
                                       float(data.get("updated", data["created"])), len(data.get("messages", []))))
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("skipping unreadable chat file %s: %s", p, e)
        return sorted(out, key=lambda s: (s.updated, s.id), reverse=True)
