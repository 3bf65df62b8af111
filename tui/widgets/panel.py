"""The live panel: mode and state, gauges fed by the event stream (pre-speculation
hit rate coloured by the 70% / 50% thresholds, acceptance, tokens/s with a
sparkline, per-token latency on hits and misses, draft and target utilization,
branch memory against its budget), then the models and devices."""

from __future__ import annotations

from typing import Any, Iterable

from rich.segment import Segment
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Sparkline, Static

from ssd_edge.config import EngineConfig
from ssd_edge.events import HIT_RATE_HEALTHY, HIT_RATE_POOR, hit_rate_health
from ssd_edge.interface import ModelInfo
from ssd_edge.memory import MemoryUse
from ssd_edge.planning.planner import k_text
from ssd_edge.stats_text import split_text

from ..live import LiveModel

TONES = ("good", "fair", "poor", "info")
HEALTH_TONE = {"healthy": "good", "fair": "fair", "poor": "poor", "n/a": "info"}
STATE_COLOURS = {"ssd": "green3", "sd": "dodger_blue1", "lookup": "cyan", "ar": "grey70",
                 "backup": "yellow3", "rolled-back": "dark_orange", "sla-cut": "red3"}
LABEL_WIDTH = 13
TEXT_WIDTH = 13
NARROW_BELOW = 120    # terminal columns below which the live panel is narrow (app.tcss: #panel.-narrow)


class Gauge(Widget):
    """A one-line bar: label, bar (with optional threshold marks), value text."""

    COMPONENT_CLASSES = {f"gauge--{t}" for t in TONES} | {"gauge--empty", "gauge--label", "gauge--mark"}
    DEFAULT_CSS = "Gauge { height: 1; }"

    def __init__(self, label: str, marks: Iterable[float] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.label = label
        self.marks = tuple(marks)
        self.fraction: float | None = None
        self.text = "—"
        self.tone = "info"

    def set(self, fraction: float | None, text: str, tone: str = "info") -> None:
        if (fraction, text, tone) != (self.fraction, self.text, self.tone):
            self.fraction, self.text, self.tone = fraction, text, tone
            self.refresh()

    def render(self) -> Text:
        width = max(self.size.width, LABEL_WIDTH + TEXT_WIDTH + 4)
        bar = width - LABEL_WIDTH - TEXT_WIDTH - 1
        filled = round(max(0.0, min(1.0, self.fraction or 0.0)) * bar)
        marks = {min(bar - 1, int(m * bar)) for m in self.marks}
        style = self.get_component_rich_style
        text = Text(self.label.ljust(LABEL_WIDTH)[:LABEL_WIDTH], style("gauge--label"), no_wrap=True)
        text.append("━" * filled, style(f"gauge--{self.tone}"))
        start = filled  # the empty rest, broken by threshold marks: a span per run, not per cell
        for mark in sorted(m for m in marks if m >= filled):
            text.append("━" * (mark - start), style("gauge--empty")).append("│", style("gauge--mark"))
            start = mark + 1
        text.append("━" * (bar - start), style("gauge--empty"))
        text.append(" " + self.text.ljust(TEXT_WIDTH)[:TEXT_WIDTH])
        return text


class RateSparkline(Sparkline):
    """Textual's sparkline, drawn from rows it keeps until its data, size or style change. Textual
    renders a sparkline through Rich's console on every repaint (2.4 ms for 3 rows of 50 bars here,
    with every panel redraw while a reply streams); its segments are the same, taken here directly."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._key: tuple | None = None
        self._rows: list[Strip] = []

    def render_line(self, y: int) -> Strip:
        width, height = self.size
        base = self.visual_style.rich_style
        key = (width, height, tuple(self.data or ()), base,
               *(self.get_component_rich_style(c) for c in sorted(self.COMPONENT_CLASSES)))
        if key != self._key:
            console = self.app.console
            segments = Segment.apply_style(self.render().__rich_console__(console, console.options), base)
            self._rows = [Strip(line).adjust_cell_length(width, base)
                          for line in Segment.split_lines(segments)][:height]
            self._key = key
        return self._rows[y] if y < len(self._rows) else Strip.blank(width, base)


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def ms(x: float | None) -> str:
    return "—" if x is None else f"{x:.0f} ms"


def describe_model(info: ModelInfo, threads: int) -> str:
    """Quantization, file size and device, e.g. 'Q4_K - Medium · 0.49 GB · CPU · 1 thr'.
    (llama.cpp's description starts with a size class that can mislead: it calls a 0.5B model '1B'.)"""
    parts = info.description.split(" ", 2)
    quant = parts[2] if len(parts) == 3 else info.description
    return f"{quant} · {info.size_bytes / 1e9:.2f} GB · {info.device} · {threads} thr"


def _rows(static: Static, text: Text, width: int) -> int:
    """How many rows `text` takes at `width` (wrapped as the Static wraps it)."""
    return len(text.wrap(static.app.console, width)) if width > 0 else -1


def set_text(static: Static, text: Text) -> None:
    """Static.update, skipped when the text is the one shown; a layout of the screen only when the text's
    height changes (a narrow panel wraps its lines: each of its updates laid the screen out otherwise).
    The shown text's rows are kept with it, so each update wraps only the new text."""
    shown = getattr(static, "_shown", None)  # (text, width, rows) of what is on screen
    if shown is not None and shown[0] == text:
        return
    width = static.content_size.width
    rows = _rows(static, text, width)
    same_height = shown is not None and width > 0 and shown[1:] == (width, rows)
    static._shown = (text, width, rows)  # type: ignore[attr-defined]
    static.update(text, layout=not same_height)


class LivePanel(VerticalScroll):
    """Drawn once per frame while a reply streams: each line and gauge is redrawn only when its value changed."""

    def fit(self, width: int) -> None:
        """A terminal narrower than NARROW_BELOW columns gets the narrow panel: at 80 columns the full
        one left the chat 26 columns, where code wraps into twice the rows (and a streaming reply lays
        the screen out twice as often)."""
        self.set_class(width < NARROW_BELOW, "-narrow")

    def compose(self) -> ComposeResult:
        # the live lines first, the models (a long regime and memory text) last: on a 24-row terminal
        # the models had pushed every gauge below the panel's edge
        yield Static("Mode", classes="section")
        yield Static("", id="mode")
        yield Static("Speculation", classes="section")
        yield Gauge("pre-spec hit", marks=(HIT_RATE_POOR, HIT_RATE_HEALTHY), id="hit")
        yield Gauge("acceptance", id="accept")
        yield Static("Throughput", classes="section")
        yield Static("", id="rate")
        yield RateSparkline([], id="spark")
        yield Static("", id="latency")
        yield Static("Resources", classes="section")
        yield Gauge("draft util", id="draft-util")
        yield Gauge("target util", id="target-util")
        yield Gauge("branch mem", id="branches")
        yield Static("Models", classes="section")
        yield Static("loading…", id="models")

    def show_models(self, info: tuple[ModelInfo | None, ModelInfo | None] | None, config: EngineConfig,
                    status: str = "", regime: str | None = None, memory: MemoryUse | None = None,
                    budget: str | None = None) -> None:
        """The pair's names and, once loaded, what Engine.model_info says of each (None: not loaded);
        regime: what the device's calibrated verify curve means for speculation, in words; memory:
        where the memory goes (Engine.memory); budget: what --memory-budget chose, in words."""
        lines = Text()
        target, draft = info or (None, None)
        for role, mc, model_info in (("target", config.target, target), ("draft", config.draft, draft)):
            if mc is None:
                lines.append(f"{role:<7}", "bold").append("none\n", "dim")
                continue
            name = mc.path.rsplit("/", 1)[-1]
            lines.append(f"{role:<7}", "bold").append(name + "\n")
            if model_info is not None:
                lines.append(" " * 7).append(describe_model(model_info, mc.threads) + "\n", "dim")
            elif status:
                lines.append(" " * 7).append(status + "\n", "dim")
            elif role == "draft" and info is not None:  # the engine loads it when a mode first drafts
                lines.append(" " * 7).append("not loaded: it loads when a mode first drafts\n", "dim")
        if regime:
            lines.append(f"{'regime':<7}", "bold").append(regime + "\n", "dim")
        if memory is not None:
            lines.append(f"{'memory':<7}", "bold").append(memory.describe() + "\n", "dim")
        if budget:
            lines.append(f"{'budget':<7}", "bold").append(budget + "\n", "dim")
        lines.rstrip()
        self.query_one("#models", Static).update(lines)

    def show_settings(self, config: EngineConfig, live: LiveModel) -> None:
        state = live.live.state if live.live else None
        text = Text.assemble(("mode ", "bold"), (config.mode, "bold"), "   state ")
        if live.generating and state:
            text.append(f"● {state}", STATE_COLOURS.get(state, "grey70"))
        else:
            text.append("○ idle" + (f" (last: {state})" if state else ""), "grey70")
        k = k_text(config.mode, config.spec.k)
        text.append(f"\n{f'k {k} · ' if k else ''}temperature {config.sampling.temperature:g}", "dim")
        set_text(self.query_one("#mode", Static), text)

    def show_live(self, live: LiveModel) -> None:
        s = live.live
        hit = s.hit_rate if s else None
        health = hit_rate_health(hit)
        self.query_one("#hit", Gauge).set(hit, f"{pct(hit)} {health}" if hit is not None else "— n/a",
                                          HEALTH_TONE[health])
        acc = s.acceptance if s else None
        self.query_one("#accept", Gauge).set(acc, pct(acc))
        now, avg = live.rate_now, live.average_rate()
        rate = Text.assemble(("tokens/s   ", "bold"), (f"{now:5.1f}" if now is not None else "    —", "bold"),
                             " now · ", (f"{avg:.1f}" if avg is not None else "—"), " avg")
        if s is not None and s.threads is not None:  # the split the last round ran at (it follows the machine)
            rate.append(f" · threads {split_text(s.threads)}", "dim")
        set_text(self.query_one("#rate", Static), rate)
        self.query_one("#spark", Sparkline).data = list(live.rates)  # a reactive: redrawn only when it differs
        lat = Text.assemble(("per token  ", "bold"), ("hit ", "green3"), ms(live.latency_ms("hit")),
                            " · ", ("miss ", "red3"), ms(live.latency_ms("miss")),
                            " · all ", ms(live.latency_ms("all")))
        set_text(self.query_one("#latency", Static), lat)
        if s is None:
            for gid in ("#draft-util", "#target-util", "#branches"):
                self.query_one(gid, Gauge).set(None, "—")
            return
        self.query_one("#draft-util", Gauge).set(s.draft_util, pct(s.draft_util))
        self.query_one("#target-util", Gauge).set(s.target_util, pct(s.target_util))
        used = s.branch_cells / s.budget_cells if s.budget_cells else None
        tone = "poor" if used is not None and used >= 1.0 else "info"
        self.query_one("#branches", Gauge).set(used, f"{s.branch_cells}/{s.budget_cells} cells"
                                               if s.budget_cells else "— no budget", tone)
