"""CosyVoice2 on a GPU in one command (``make gpu-bench``): a machine with PyTorch and
an NVIDIA GPU, and no network.

1. Installs what it lacks of ``tests/bench/cosyvoice2_gpu_wheels.txt`` from a wheel
   directory prepared where an index is reachable (``make gpu-wheels``), without
   dependencies and without an index: only distributions not installed at all.
2. Writes the official-size random-weight model directory (or uses ``--model-dir``).
3. Loads one backend (LLM float32) and runs the conformance with upstream
   (tests/bench/cosyvoice2_conformance.py: tokens, and the waveform on upstream's hops).
4. Runs the capacity benchmark's levels (tests/bench/cosyvoice2_capacity.py: first-chunk
   p95, gaps, this engine against upstream's per-request path) with the LLM in float32,
   then the engine again with the LLM cast to bfloat16; GPU memory per stream from the
   peak allocation of each level.
5. Writes one JSON and one Markdown table (``--out``).

Levels stop once ``--budget-s`` has been spent (the run is meant to end within 8
minutes). Dry run on a CPU at tiny sizes:

    python -m tests.bench.cosyvoice2_gpu --dims tiny --device cpu --levels 1 2 --wheels none
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WHEEL_LIST = Path(__file__).with_name("cosyvoice2_gpu_wheels.txt")


def requirements() -> list[tuple[str, str]]:
    pins = []
    for line in WHEEL_LIST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins.append((name.strip(), version.strip()))
    return pins


def install_missing(wheels: Path) -> list[str]:
    """``pip install --no-index --no-deps`` of the listed distributions not installed."""
    missing = []
    for name, version in requirements():
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{name}=={version}")
    if missing:
        command = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps"]
        subprocess.run([*command, "--find-links", str(wheels), *missing], check=True)
    return missing


def peak_memory(device: str) -> int:
    import torch

    if not device.startswith("cuda"):
        return 0
    return int(torch.cuda.max_memory_allocated(torch.device(device)))


def reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(torch.device(device))


def capacity(
    backend: Any, levels: list[int], paths: list[str], label: str, deadline: float, device: str
) -> list[dict[str, Any]]:
    from tests.bench import cosyvoice2_capacity as cap

    cap.run_engine(backend, 1)  # warm-up
    rows: list[dict[str, Any]] = []
    for n in levels:
        for path in paths:
            if time.monotonic() > deadline:
                print(f"budget spent: {label} {path} {n} streams not run", flush=True)
                return rows
            reset_peak(device)
            base = peak_memory(device)
            started = time.perf_counter()
            records = (
                cap.run_engine(backend, n) if path == "engine" else cap.run_official(backend, n)
            )
            row = cap.summarize(path, n, records, time.perf_counter() - started)
            row["llm"] = label
            peak = peak_memory(device)
            row["gpu_peak_mib"] = round(peak / 2**20, 1) if peak else None
            row["gpu_mib_per_stream"] = round((peak - base) / 2**20 / n, 2) if peak else None
            rows.append(row)
            print(row, flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| LLM | path | streams | first chunk p50 / p95 (ms) | gaps | errors | audio s / wall s "
        "| GPU MiB / stream | meets |",
        "|---|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['llm']} | {r['path']} | {r['streams']} | {r['first_chunk_p50_ms']} / "
            f"{r['first_chunk_p95_ms']} | {r['streams_with_gaps']} | {r['errors']} | "
            f"{r['audio_per_wall_s']} | {r['gpu_mib_per_stream']} | "
            f"{'yes' if r['meets'] else 'no'} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", default="artifacts/gpu-wheels", help="'none': no install")
    parser.add_argument("--dims", choices=("tiny", "official"), default="official")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--levels", type=int, nargs="+", default=[16, 64, 128, 256])
    parser.add_argument("--official-levels", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--max-ratio", type=float, default=3.0)
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--out", type=Path, default=Path("artifacts/cosyvoice2_gpu"))
    args = parser.parse_args(argv)
    started = time.monotonic()
    deadline = started + args.budget_s
    installed = [] if args.wheels == "none" else install_missing(Path(args.wheels))
    print(f"installed from {args.wheels}: {installed or 'nothing missing'}", flush=True)

    import torch

    from engine.backends.cosyvoice2.backend import CosyVoice2Backend, CosyVoice2Settings
    from tests.bench import report
    from tests.bench.cosyvoice2_conformance import conformance
    from tests.bench.cosyvoice2_conformance import table as conformance_table
    from tests.engine.cosyvoice2.tiny_model import OFFICIAL, TINY, write_model

    body: dict[str, Any] = report.provenance("tests.bench.cosyvoice2_gpu", argv)
    body.update(dims=args.dims, device=args.device, installed=installed)
    if args.device.startswith("cuda"):
        body["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="cosyvoice2-gpu-") as scratch:
        directory = args.model_dir or Path(scratch) / "model"
        if not (directory / "cosyvoice2.yaml").exists():
            mark = time.monotonic()
            write_model(directory, OFFICIAL if args.dims == "official" else TINY)
            timings["write_model_s"] = round(time.monotonic() - mark, 1)
        mark = time.monotonic()
        settings = CosyVoice2Settings(
            model_dir=directory,
            device=args.device,
            dtype="float32",
            max_streams=max(args.levels),
        )
        backend = CosyVoice2Backend(settings)
        timings["load_s"] = round(time.monotonic() - mark, 1)
        mark = time.monotonic()
        checked = conformance(backend, max_ratio=args.max_ratio, waveform=True)
        timings["conformance_s"] = round(time.monotonic() - mark, 1)
        body["conformance"] = checked
        backend.decoder.max_token_text_ratio = args.max_ratio
        mark = time.monotonic()
        rows = capacity(backend, args.levels, ["engine"], "float32", deadline, args.device)
        rows += capacity(
            backend, args.official_levels, ["official"], "float32", deadline, args.device
        )
        backend.model.llm.to(torch.bfloat16)  # the same weights, the LLM in bfloat16
        backend.decoder.pool = None  # a new pool in the new precision
        rows += capacity(backend, args.levels, ["engine"], "bfloat16", deadline, args.device)
        timings["capacity_s"] = round(time.monotonic() - mark, 1)
        backend.close()
    timings["total_s"] = round(time.monotonic() - started, 1)
    body.update(capacity=rows, timings=timings)
    lines = [
        report.generated_line(body),
        "",
        *report.provenance_lines(body),
        f"- Model: random weights, **{args.dims}** dimensions, device {args.device} "
        f"({body.get('gpu', 'no GPU')}); flow float32; at most {args.max_ratio:g} speech "
        f"tokens per text token; timings {timings}",
        "",
        "Conformance with upstream (LLM float32):",
        "",
        *conformance_table(checked),
        "",
        "Capacity (first-chunk p95 goal 500 ms, no gaps):",
        "",
        *table(rows),
    ]
    report.publish(
        args.out,
        "cosyvoice2_gpu.json",
        body,
        "\n".join(lines) + "\n",
        docs=Path("docs/cosyvoice2.md"),
        markers=("", ""),
        update_docs=False,
    )
    (args.out / "cosyvoice2_gpu.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
