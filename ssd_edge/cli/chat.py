"""The terminal chat behind `ssd-edge chat`.

ChatSession is the loop. It reads lines through a reader (a terminal with line
editing, or any text stream: a here-doc, a pipe, a test) and writes to a rich
Console, so it runs and is tested without a TTY. Each answer streams from
`engine.generate(messages=...)` (the model's own chat template) while
CancelOnSignal turns Ctrl-C into a cancel event: the answer stops, the session
goes on. Ctrl-D (end of input) or /quit leaves.

Input: a line ending in a backslash continues on the next line; a line that is
just \"\"\" opens a block that runs to the next \"\"\". A line starting with / is
a command (/help lists them); start it with // to send a literal /.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, TextIO

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from pydantic import ValidationError

from .. import paths, settings
from ..errors import ConfigError, ContextFullError, SSDEdgeError
from ..events import FinishEvent, TokenEvent
from ..planning.planner import k_text
from ..stats_text import stats_line, stats_table
from ..structured import Constraint
from .signals import EXIT_TERMINATED, CancelOnSignal
from .structured import readable_view

PROMPT = "you › "
MORE = "  … "
BLOCK = '"""'
CHAT_FORMAT = 1  # the layout of tui/chats.py (format 1), so `ssd-edge tui` lists chats saved here

HELP = """\
[bold]/mode[/] \\[ar|sd|lookup|ssd|auto]   show or set the decoding mode
[bold]/k[/] \\[N]                          show or set draft tokens per round
[bold]/temp[/] \\[T]                       show or set the temperature (0 = greedy)
[bold]/system[/] \\[TEXT|none]             show, set or clear the system prompt
[bold]/clear[/]                          forget the conversation (keeps the system prompt)
[bold]/save[/] \\[FILE]                    save the chat: .md as Markdown, else JSON
                                  (default: the chats folder, where `ssd-edge tui` finds it)
[bold]/stats[/]                          every number of the last answer
[bold]/help[/]                           this list
[bold]/quit[/]                           leave (or Ctrl-D)
A line ending in \\ continues; \"\"\" on its own line opens and closes a block.
Ctrl-C stops an answer; //text sends a line that starts with /."""


class Reader(Protocol):
    def __call__(self, prompt: str) -> str | None:
        """One line without its newline; None at end of input. May raise KeyboardInterrupt."""


class ChatEngine(Protocol):
    """What the session needs of an Engine (a fake one implements this in tests)."""

    config: Any

    def generate(self, prompt: str | None = None, **kwargs: Any) -> Any: ...
    def prompt_tokens(self, prompt: str | None = None, messages: Sequence[dict[str, str]] | None = None
                      ) -> list[int]: ...
    def configure(self, **changes: Any) -> Any: ...


def terminal_reader(console: Console) -> Reader:
    """Read from the terminal with line editing and history (readline, where Python has it)."""
    try:
        import readline  # noqa: F401  (importing it gives input() editing and history)
    except ImportError:  # pragma: no cover - Windows
        pass

    def styled(prompt: str) -> str:
        # input() must print the prompt itself so readline knows its width when it redraws
        # the line; \001 and \002 tell readline the colour codes take no room.
        if console.color_system is None:
            return prompt
        return f"\001\x1b[1;36m\002{prompt}\001\x1b[0m\002"

    def read(prompt: str) -> str | None:
        try:
            return input(styled(prompt))
        except EOFError:
            console.print()
            return None
    return read


def stream_reader(stream: TextIO, console: Console, echo: bool = True) -> Reader:
    """Read lines from a stream; with `echo`, show each line after its prompt, as a terminal would."""
    def read(prompt: str) -> str | None:
        try:
            line = stream.readline()
        except UnicodeDecodeError as e:
            raise ConfigError(f"the input is not valid UTF-8 (byte 0x{e.object[e.start]:02x})") from None
        if not line:
            return None
        line = line.rstrip("\r\n")
        if echo:
            console.print(Text.assemble((prompt, "bold cyan"), line))
        return line
    return read


class ChatSession:
    def __init__(self, engine: ChatEngine, console: Console, *, max_tokens: int, stop: Sequence[str] = (),
                 system: str | None = None, title: str = "", constraint: Constraint | None = None) -> None:
        self.engine = engine
        self.constraint = constraint  # every answer's (--json-schema, --json-object, --regex, --grammar)
        self.console = console
        self.max_tokens = max_tokens
        self.stop = list(stop)
        self.system = system or ""
        self.title = title
        self.messages: list[dict[str, str]] = []  # user and assistant turns, oldest first
        self.last: FinishEvent | None = None
        self.created = time.time()
        self.chat_id = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.created))
        self.commands: dict[str, Callable[[str], bool]] = {
            "mode": self._mode, "k": self._k, "temp": self._temp, "system": self._system, "clear": self._clear,
            "save": self._save, "stats": self._stats, "help": self._help, "quit": self._quit, "exit": self._quit,
        }

    # ------------------------------------------------------------ the loop
    def run(self, read: Reader) -> int:
        """Chat until end of input or /quit; the exit code (0, or 143 after SIGTERM)."""
        self.banner()
        while True:
            try:
                text = self.read_message(read)
            except KeyboardInterrupt:
                self.console.print("\n[dim](input discarded; Ctrl-D or /quit to leave)[/]")
                continue
            if text is None:
                return 0
            if not text.strip():
                continue
            if text.startswith("/") and not text.startswith("//"):
                if not self.command(text.strip()):
                    return 0
                continue
            code = self.answer(text[1:] if text.startswith("//") else text)
            if code:
                return code

    def banner(self) -> None:
        cfg = self.engine.config
        self.console.print(f"[bold]ssd-edge chat[/] {escape(self.title)}", highlight=False)
        self.console.print(f"[dim]{self._settings_text()} · ctx {cfg.n_ctx} · /help for commands, "
                           "Ctrl-C stops an answer, Ctrl-D quits[/]", highlight=False)

    def read_message(self, read: Reader) -> str | None:
        """One message: a line, a backslash-continued run of lines, or a \"\"\" block."""
        line = read(PROMPT)
        if line is None:
            return None
        if line.strip().startswith(BLOCK):
            first = line.strip()[len(BLOCK):]
            if first.endswith(BLOCK):  # """one line"""
                return first[:-len(BLOCK)]
            parts = [first] if first else []
            while (more := read(MORE)) is not None:
                if more.rstrip().endswith(BLOCK):
                    last = more.rstrip()[:-len(BLOCK)]
                    if last:
                        parts.append(last)
                    break
                parts.append(more)
            return "\n".join(parts)
        parts = []
        while line.endswith("\\"):
            parts.append(line[:-1])
            line = read(MORE)
            if line is None:
                line = ""
                break
        parts.append(line)
        return "\n".join(parts)

    # ------------------------------------------------------------ one answer
    def prompt_messages(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system.strip() else []
        return head + self.messages

    def fit(self) -> list[dict[str, str]]:
        """The messages to send, dropping the oldest turns while the prompt leaves less
        than a quarter of the context (or max_tokens, if smaller) for the answer."""
        n_ctx = self.engine.config.n_ctx
        room = min(self.max_tokens, n_ctx // 4)
        dropped = 0
        while len(self.messages) > 1:
            n = len(self.engine.prompt_tokens(messages=self.prompt_messages()))
            if n + room <= n_ctx:
                break
            # drop the oldest exchange: a user turn and the answer after it
            cut = 2 if len(self.messages) > 2 and self.messages[1]["role"] == "assistant" else 1
            del self.messages[:cut]
            dropped += cut
        if dropped:
            self.console.print(f"[dim](left out the {dropped} oldest messages to fit the context of {n_ctx} "
                               "tokens)[/]")
        return self.prompt_messages()

    def answer(self, text: str) -> int:
        """Stream one answer to `text`; 0, or 143 when SIGTERM came during it."""
        self.messages.append({"role": "user", "content": text})
        cancel = threading.Event()
        finish: FinishEvent | None = None
        state: str | None = None
        written = ""
        try:
            messages = self.fit()
            # force=False: a second Ctrl-C must not cut the engine mid-decode; it stops within a round
            with CancelOnSignal(cancel, force=False) as sig:
                events = self.engine.generate(messages=messages, max_tokens=self.max_tokens, stop=self.stop,
                                              cancel=cancel, constraint=self.constraint)
                try:
                    for ev in events:
                        delta = ev.text if isinstance(ev, TokenEvent) else ev.tail
                        if isinstance(ev, TokenEvent):
                            state = ev.live.state
                        else:
                            finish = ev
                        if delta:
                            self.console.print(delta, end="", markup=False, highlight=False)
                            written += delta
                finally:
                    events.close()
        except ContextFullError as e:
            self.messages.pop()
            self.console.print(f"[red]error:[/] {escape(str(e))}; /clear starts over")
            return 0
        except SSDEdgeError as e:
            self.messages.pop()
            if written:
                self.console.print()
            self.console.print(f"[red]error:[/] {escape(str(e))}")
            return 0
        assert finish is not None
        if written and not written.endswith("\n"):
            self.console.print()
        for part in readable_view(finish.text):  # JSON laid out, tool calls by name, below the raw answer
            self.console.print(part)
        self.last = finish
        if finish.text:
            self.messages.append({"role": "assistant", "content": finish.text})
        else:
            self.messages.pop()  # nothing was said: forget the question too, so the turns stay paired
        if finish.stop_reason == "cancelled":
            self.console.print("[yellow](stopped)[/]")
        elif finish.stop_reason == "context":
            self.console.print(f"[yellow](stopped: {escape(finish.message or 'the context is full')}; "
                               "/clear starts over)[/]")
        self.console.print(stats_line(finish.stats, state), highlight=False)
        return EXIT_TERMINATED if sig.signum == signal.SIGTERM else 0

    # ------------------------------------------------------------ commands
    def command(self, line: str) -> bool:
        """Run a /command; False means leave."""
        name, _, arg = line[1:].partition(" ")
        handler = self.commands.get(name.lower())
        if handler is None:
            self.console.print(f"[red]unknown command[/] /{escape(name)} (/help lists them)")
            return True
        try:
            return handler(arg.strip())
        except ConfigError as e:
            self.console.print(f"[red]error:[/] {escape(str(e))}")
            return True

    def _settings_text(self) -> str:
        cfg = self.engine.config
        k = k_text(cfg.mode, cfg.spec.k)
        return f"mode {cfg.mode}{f' · k {k}' if k else ''} · temp {cfg.sampling.temperature:g}"

    def _set(self, command: str, arg: str, parse: Callable[[str], Any], setting: str) -> bool:
        """Show the settings, or parse `arg` and hand it to engine.configure(setting=...)."""
        if arg:
            try:
                value = parse(arg)
            except ValueError:
                raise ConfigError(f"/{command} needs a number, not {arg!r}") from None
            trial = self.engine.config.model_copy(deep=True)
            part, name = {"mode": (trial, "mode"), "k": (trial.spec, "k"),
                          "temperature": (trial.sampling, "temperature")}[setting]
            try:
                setattr(part, name, value)  # validated on assignment: the same rules as the flags
            except ValidationError as e:
                raise ConfigError(f"/{command} {arg}: {settings.reason(e)}") from None
            self.engine.configure(**{setting: value})
        self.console.print(f"[dim]{self._settings_text()}[/]", highlight=False)
        return True

    def _mode(self, arg: str) -> bool:
        return self._set("mode", arg.lower(), str, "mode")

    def _k(self, arg: str) -> bool:
        return self._set("k", arg, lambda a: None if a.lower() == "auto" else int(a), "k")  # auto: planned

    def _temp(self, arg: str) -> bool:
        return self._set("temp", arg, float, "temperature")

    def _system(self, arg: str) -> bool:
        if not arg:
            self.console.print(f"system prompt: {escape(self.system)}" if self.system else "no system prompt")
        elif arg.lower() == "none":
            self.system = ""
            self.console.print("[dim]system prompt cleared[/]")
        else:
            self.system = arg
            self.console.print("[dim]system prompt set[/]")
        return True

    def _clear(self, arg: str) -> bool:
        self.messages.clear()
        self.last = None
        self.console.print("[dim]conversation cleared[/]")
        return True

    def _stats(self, arg: str) -> bool:
        if self.last is None:
            self.console.print("no answer yet")
        else:
            self.console.print(stats_table(self.last.stats))
        return True

    def _help(self, arg: str) -> bool:
        self.console.print(HELP, highlight=False)
        return True

    def _quit(self, arg: str) -> bool:
        return False

    def _save(self, arg: str) -> bool:
        path = Path(arg).expanduser() if arg else paths.chats_dir() / f"{self.chat_id}.json"
        if path.suffix.lower() == ".md":
            data = self.markdown()
        else:
            data = json.dumps(self.to_json(), ensure_ascii=False, indent=1)
        try:
            write_atomically(path, data)
        except OSError as e:
            self.console.print(f"[red]error:[/] cannot save to {escape(str(path))}: {escape(e.strerror or str(e))}")
            return True
        self.console.print(f"[dim]saved {len(self.messages)} messages to {escape(str(path))}[/]", highlight=False)
        return True

    # ------------------------------------------------------------ saving
    def to_json(self) -> dict[str, Any]:
        first = next((m["content"] for m in self.messages if m["role"] == "user"), "")
        return {"format": CHAT_FORMAT, "id": self.chat_id, "created": self.created, "updated": time.time(),
                "system": self.system, "title": first.splitlines()[0][:60] if first else "",
                "messages": [{"role": m["role"], "content": m["content"], "runs": [], "note": ""}
                             for m in self.messages]}

    def markdown(self) -> str:
        out = [f"# ssd-edge chat {self.chat_id}", ""]
        if self.system:
            out += [f"**system:** {self.system}", ""]
        for m in self.messages:
            out += [f"**{m['role']}:**", "", m["content"], ""]
        return "\n".join(out)


def write_atomically(path: Path, data: str) -> None:
    """Write a temporary file beside `path`, then rename: never half a file under the name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
