"""CosyVoice2 on a GPU in one device call (``tests/bench/cosyvoice2_gpu.sh``, which
installs the carried wheels first; ``make gpu-bench``; docs/cosyvoice2.md gives the call).

1. Writes the official-size random-weight model directory (or uses ``--model-dir``).
2. Loads one backend (LLM float32) and runs the conformance with upstream
   (tests/bench/cosyvoice2_conformance.py: tokens, and the waveform on upstream's hops).
3. Runs the capacity benchmark's levels (tests/bench/cosyvoice2_capacity.py: first-chunk
   p95, gaps, this engine against upstream's per-request path) with the LLM in float32,
   then the engine again with the LLM cast to bfloat16; GPU memory per stream from the
   peak allocation of each level.
4. Writes one JSON and one Markdown table (``--out``) after every stage and every level,
   so a run cut off still leaves what it measured; each stage prints its elapsed time.

The whole run keeps inside ``--budget-s`` (300 s: with the install and the start of Python
about 5.5 minutes, so that the first call and a rerun fit a task's 15 minutes of device
time, machine starts included) from its start: each capacity phase gets a share
of the time left when it begins, and a level is skipped when the one before it, scaled by
the stream count, says it would not end in its phase's share. The JSON also records which
distributions the run imported and from where (tests/bench/gpu_imports.py): the carried
wheels, the image, the project. Dry run on a CPU at tiny sizes:

    python -m tests.bench.cosyvoice2_gpu --dims tiny --device cpu --levels 1 2 --official-levels 1
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

# (LLM precision, path, which levels, share of the time left when the phase starts)
PHASES = (
    ("float32", "engine", "levels", 0.4),
    ("float32", "official", "official_levels", 0.2),
    ("bfloat16", "engine", "levels", 0.4),
)


class Clock:
    """Elapsed time since the run began, and progress lines that say it (flushed)."""

    def __init__(self, budget_s: float) -> None:
        self.started = time.monotonic()
        self.deadline = self.started + budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def stage(self, what: str) -> None:
        print(f"[{self.elapsed():7.1f} s] {what}", flush=True)


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
    backend: Any,
    levels: list[int],
    path: str,
    label: str,
    clock: Clock,
    share: float,
    device: str,
    record: Callable[[dict[str, Any]], None],
) -> None:
    """Measure ``levels`` on one path until this phase's share of the time left is spent;
    ``record`` gets each row as it is measured."""
    from tests.bench import cosyvoice2_capacity as cap

    phase_end = time.monotonic() + max(0.0, clock.left()) * share
    if phase_end <= time.monotonic():
        clock.stage(f"budget spent: capacity {label} {path} not run")
        return
    clock.stage(f"capacity {label} {path}: levels {levels}, {phase_end - time.monotonic():.0f} s")
    cap.run_engine(backend, 1)  # warm-up
    last: tuple[int, float] | None = None
    for n in levels:
        predicted = last[1] * n / last[0] if last else 0.0
        if time.monotonic() + predicted > phase_end:
            clock.stage(f"budget: {label} {path} {n} streams not run (about {predicted:.0f} s)")
            return
        reset_peak(device)
        base = peak_memory(device)
        started = time.perf_counter()
        records = cap.run_engine(backend, n) if path == "engine" else cap.run_official(backend, n)
        wall = time.perf_counter() - started
        row = cap.summarize(path, n, records, wall)
        row["llm"] = label
        peak = peak_memory(device)
        row["gpu_peak_mib"] = round(peak / 2**20, 1) if peak else None
        row["gpu_mib_per_stream"] = round((peak - base) / 2**20 / n, 2) if peak else None
        record(row)
        clock.stage(f"{label} {path} {n} streams: {row}")
        last = (n, wall)


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


def markdown(body: dict[str, Any]) -> str:
    from tests.bench import report
    from tests.bench.cosyvoice2_conformance import table as conformance_table

    imports = body.get("imports", {}).get("distributions", {})
    versions = ", ".join(
        f"{name} {imports[name]['version']}"
        for name in ("torch", "torchaudio", "transformers", "numpy", "onnxruntime")
        if name in imports
    )
    lines = [
        report.generated_line(body),
        "",
        *report.provenance_lines(body),
        f"- Model: random weights, **{body['dims']}** dimensions, device {body['device']} "
        f"({body.get('gpu', 'no GPU')}); flow float32; at most {body['max_ratio']:g} speech "
        f"tokens per text token; Python {body['python']}; {versions}",
        f"- Timings (s): {body['timings']}; stopped at: {body['stage']}",
    ]
    if "conformance_error" in body:
        lines += ["", f"Conformance with upstream: failed, {body['conformance_error']}"]
    if "conformance" in body:
        lines += ["", "Conformance with upstream (LLM float32):", ""]
        lines += conformance_table(body["conformance"])
    lines += ["", "Capacity (first-chunk p95 goal 500 ms, no gaps):", "", *table(body["capacity"])]
    problems = body.get("imports", {}).get("problems")
    if problems:
        lines += ["", "Imports outside the image and the carried wheels:", ""]
        lines += [f"- {p}" for p in problems]
    return "\n".join(lines) + "\n"


def write(out: Path, body: dict[str, Any]) -> None:
    """The JSON and the Markdown as they stand (rewritten after every stage)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "cosyvoice2_gpu.json").write_text(json.dumps(body, indent=1))
    (out / "cosyvoice2_gpu.md").write_text(markdown(body))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", choices=("tiny", "official"), default="official")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--levels", type=int, nargs="+", default=[16, 64, 128, 256])
    parser.add_argument("--official-levels", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--max-ratio", type=float, default=3.0)
    parser.add_argument("--budget-s", type=float, default=300.0, help="the whole run's")
    parser.add_argument("--site", type=Path, help="where the carried wheels were installed")
    parser.add_argument("--image-list", type=Path, help="the image's distributions (audit)")
    parser.add_argument("--out", type=Path, default=Path("artifacts/cosyvoice2_gpu"))
    args = parser.parse_args(argv)
    clock = Clock(args.budget_s)
    clock.stage(f"Python {sys.version.split()[0]} ({sys.executable}); importing torch")

    import torch

    from engine.backends.cosyvoice2.backend import CosyVoice2Backend, CosyVoice2Settings
    from tests.bench import gpu_imports, gpu_wheels, report
    from tests.bench.cosyvoice2_conformance import conformance
    from tests.engine.cosyvoice2.tiny_model import OFFICIAL, TINY, write_model

    body: dict[str, Any] = report.provenance("tests.bench.cosyvoice2_gpu", argv)
    timings: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    body.update(
        dims=args.dims,
        device=args.device,
        max_ratio=args.max_ratio,
        python=sys.version.split()[0],
        torch=torch.__version__,
        cuda=torch.version.cuda,
        timings=timings,
        capacity=rows,
    )
    if args.device.startswith("cuda"):
        body["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    image = gpu_wheels.load_image(args.image_list or gpu_wheels.IMAGE_LIST)
    pins = [name for name, _ in gpu_wheels.read_pins()]

    def reached(stage: str, started: float | None = None, key: str | None = None) -> None:
        if started is not None and key is not None:
            timings[key] = round(time.monotonic() - started, 1)
        timings["total_s"] = round(clock.elapsed(), 1)
        body["stage"] = stage
        body["imports"] = gpu_imports.audit(image.packages, pins, args.site)
        write(args.out, body)
        clock.stage(stage + (f" ({key} {timings[key]})" if key else ""))

    def record(row: dict[str, Any]) -> None:
        rows.append(row)
        reached(f"capacity {row['llm']} {row['path']} {row['streams']}")

    reached(f"torch {torch.__version__} imported, device {body.get('gpu', args.device)}")
    with tempfile.TemporaryDirectory(prefix="cosyvoice2-gpu-") as scratch:
        directory = args.model_dir or Path(scratch) / "model"
        if not (directory / "cosyvoice2.yaml").exists():
            clock.stage(f"writing the {args.dims} model directory")
            mark = time.monotonic()
            write_model(directory, OFFICIAL if args.dims == "official" else TINY)
            reached("model written", mark, "write_model_s")
        mark = time.monotonic()
        settings = CosyVoice2Settings(
            model_dir=directory,
            device=args.device,
            dtype="float32",
            max_streams=max(args.levels),
        )
        backend = CosyVoice2Backend(settings)
        reached("model loaded", mark, "load_s")
        mark = time.monotonic()
        try:
            body["conformance"] = conformance(backend, max_ratio=args.max_ratio, waveform=True)
            outcome = f"all equal {body['conformance']['all_equal']}"
        except Exception as exc:  # the capacity figures are still worth the call's time
            traceback.print_exc()
            body["conformance_error"] = outcome = repr(exc)
        reached(f"conformance: {outcome}", mark, "conformance_s")
        backend.decoder.max_token_text_ratio = args.max_ratio
        mark = time.monotonic()
        precision = "float32"
        for index, (label, path, which, share) in enumerate(PHASES):
            if label != precision:  # bfloat16: the same weights, the LLM cast
                backend.model.llm.to(getattr(torch, label))
                backend.decoder.pool = None  # a new pool in the new precision
                precision = label
            fraction = share / sum(s for *_, s in PHASES[index:])
            levels = getattr(args, which)
            capacity(backend, levels, path, label, clock, fraction, args.device, record)
        reached("capacity done", mark, "capacity_s")
        backend.close()
    reached("done")
    print(markdown(body), flush=True)


if __name__ == "__main__":
    main()
