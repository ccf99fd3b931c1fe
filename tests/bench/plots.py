"""PNG plots of benchmark results (matplotlib, Agg backend: no display needed).

- ``latency_cdf.png``: first-audio latency CDF, one line per (server, concurrency);
- ``gap_histogram.png``: inter-frame gap histogram per server (log counts);
- ``vs_concurrency.png``: first-audio p50/p99, p99 gap and CPU against concurrency;
- ``soak_memory.png``: memory of the server's processes over a soak run.
"""

from __future__ import annotations

import importlib
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from tests.bench.soak import parts

STYLE = {"gateway": "-", "baseline": "--", "external": "-."}


def available() -> bool:
    """matplotlib is an optional dependency of the benchmark: no plots without it."""
    try:
        _pyplot()
    except ImportError:
        return False
    return True


@cache
def _pyplot() -> Any:
    # Imported at run time (typed Any) so that the project type-checks and its tests run
    # where matplotlib is not installed.
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def _name(level: dict[str, Any]) -> str:
    return str(level["target"]["name"])


def latency_cdf(levels: list[dict[str, Any]], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for level in levels:
        values = np.asarray(level["client"]["first_audio_sorted_ms"], dtype=float)
        if not values.size:
            continue
        total = values.size + level["client"]["utterances"]["no_audio"]
        y = np.arange(1, values.size + 1) / total
        ax.step(
            np.maximum(values, 0.1),
            y,
            STYLE.get(_name(level), "-"),
            where="post",
            label=f"{_name(level)} x{level['sessions']}",
        )
    ax.set_xscale("log")
    ax.set_xlabel("first-audio latency (ms, speak sent -> first frame received)")
    ax.set_ylabel("fraction of utterances")
    ax.axhline(0.99, color="grey", lw=0.5)
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, 8)
    ax.set_title("First-audio latency CDF")
    return _save(fig, path)


def gap_histogram(levels: list[dict[str, Any]], path: Path) -> Path:
    plt = _pyplot()
    names = sorted({_name(level) for level in levels})
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 3.2 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        for level in (lv for lv in levels if _name(lv) == name):
            hist = level["client"]["gap_histogram"]
            counts = np.asarray(hist["counts"], dtype=float)
            if not counts.sum():
                continue
            edges = np.arange(counts.size) * hist["bin_ms"]
            ax.step(edges, np.maximum(counts, 0.5), where="post", label=f"x{level['sessions']}")
        ax.set_yscale("log")
        ax.set_xlim(0, 100)
        ax.axvline(30, color="red", lw=0.6, ls=":")
        ax.set_title(f"{name}: inter-frame gaps (1 ms bins; goal p99 <= 30 ms)")
        ax.set_xlabel("gap (ms)")
        ax.set_ylabel("frames")
        _legend(ax, 8)
        ax.grid(True, alpha=0.3)
    return _save(fig, path)


def vs_concurrency(levels: list[dict[str, Any]], path: Path) -> Path:
    plt = _pyplot()
    fig, (ax_lat, ax_gap, ax_cpu) = plt.subplots(1, 3, figsize=(15, 4.5))
    for name in sorted({_name(level) for level in levels}):
        runs = sorted((lv for lv in levels if _name(lv) == name), key=lambda lv: lv["sessions"])
        n = [lv["sessions"] for lv in runs]
        style = STYLE.get(name, "-")
        for q, marker in (("p50", "o"), ("p99", "^")):
            ys = [_nan(lv["client"]["first_audio_ms"][q]) for lv in runs]
            ax_lat.plot(n, ys, style, marker=marker, label=f"{name} {q}")
        ax_gap.plot(
            n, [_nan(lv["client"]["gap_ms"]["p99"]) for lv in runs], style, marker="o", label=name
        )
        for role, marker in (("server", "o"), ("engine", "s"), ("loadgen", "x")):
            ys = [_nan(lv["cpu_pct"].get(role)) for lv in runs]
            if not all(np.isnan(ys)):
                ax_cpu.plot(n, ys, style, marker=marker, label=f"{name} {role}")
    ax_lat.set_yscale("log")
    for ax in (ax_lat, ax_gap, ax_cpu):
        ax.set_xscale("log")
    ax_lat.set_title("first-audio latency (ms)")
    ax_gap.set_title("p99 inter-frame gap (ms)")
    ax_cpu.set_title("CPU (% of one core)")
    for ax in (ax_lat, ax_gap, ax_cpu):
        ax.set_xlabel("concurrent calls")
        ax.grid(True, which="both", alpha=0.3)
        _legend(ax, 7)
    return _save(fig, path)


def soak_memory(level: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    timeline = level["timeline"]
    t = [p["t_s"] for p in timeline]
    for part, series in parts(timeline).items():
        ax.plot(t, np.asarray(series, dtype=float) / 1024, label=part)
    ax.plot(t, [p["total_kib"] / 1024 for p in timeline], "k-", label="total (anon + rings)")
    ax.set_xlabel("time in window (s)")
    ax.set_ylabel("MiB")
    ax.set_title(f"{_name(level)}: memory, {level['sessions']} calls")
    ax.grid(True, alpha=0.3)
    _legend(ax, 8)
    return _save(fig, path)


def plot_all(levels: list[dict[str, Any]], out: Path) -> list[Path]:
    """Every plot that ``levels`` supports, written into ``out`` (none without matplotlib)."""
    if not levels or not available():
        return []
    paths = [
        latency_cdf(levels, out / "latency_cdf.png"),
        gap_histogram(levels, out / "gap_histogram.png"),
    ]
    if len({lv["sessions"] for lv in levels}) > 1:
        paths.append(vs_concurrency(levels, out / "vs_concurrency.png"))
    return paths


def _legend(ax: Any, size: int) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=size)


def _nan(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def _save(fig: Any, path: Path) -> Path:
    plt = _pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
