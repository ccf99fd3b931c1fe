"""CosyVoice2's LLM decode step with the pre-allocated KV pool, at N streams: time per
step, against what the step used to add (every stream's cache padded, concatenated into
a batch and split back: a copy of every cache in and out of every step), measured here on
the same caches.

Each stream is given a cache of ``--positions`` random keys and values (as a prefill of
that length would leave; no prefill is run), then ``--steps`` decode steps of all N:

    python -m tests.bench.cosyvoice2_kv --dims official --streams 16 64 256 --steps 3
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tests.bench import report


def old_copy_s(layers: list[list[tuple[torch.Tensor, torch.Tensor]]], lengths: list[int]) -> float:
    """The copy the step did before the pool: pad every stream's cache to the longest,
    concatenate per layer, and split each stream's back out (``contiguous``)."""
    started = time.perf_counter()
    longest = max(lengths)
    for layer in range(len(layers[0])):
        keys = [
            torch.nn.functional.pad(s[layer][0], (0, 0, longest - n, 0))
            for s, n in zip(layers, lengths, strict=True)
        ]
        values = [
            torch.nn.functional.pad(s[layer][1], (0, 0, longest - n, 0))
            for s, n in zip(layers, lengths, strict=True)
        ]
        k, v = torch.cat(keys), torch.cat(values)
        for row, n in enumerate(lengths):
            k[row : row + 1, :, -(n + 1) :].contiguous()
            v[row : row + 1, :, -(n + 1) :].contiguous()
    return time.perf_counter() - started


@torch.inference_mode()
def measure(decoder: Any, n: int, positions: int, steps: int) -> dict[str, Any]:
    from engine.backends.cosyvoice2.streaming import LlmState

    config = decoder._config
    kv_heads = int(config.num_key_value_heads)
    head_dim = int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )
    layers = int(config.num_hidden_layers)
    hidden = int(config.hidden_size)
    device = decoder.model.device
    dtype = next(decoder.model.llm.parameters()).dtype
    generator = torch.Generator().manual_seed(n)
    states, caches, lengths = [], [], []
    decoder.pool = None
    for i in range(n):
        length = positions - (i % 7)  # ragged, as real streams are
        cache = [
            (
                torch.randn(1, kv_heads, length, head_dim, generator=generator).to(device, dtype),
                torch.randn(1, kv_heads, length, head_dim, generator=generator).to(device, dtype),
            )
            for _ in range(layers)
        ]
        state = LlmState(
            lm_input=torch.randn(1, 1, hidden, generator=generator).to(device, dtype),
            min_len=10**9,
            max_len=10**9,
            generator=torch.Generator().manual_seed(i),
        )
        decoder._pool(cache[0][0]).admit(state, cache)
        states.append(state)
        caches.append(cache)
        lengths.append(length)
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        decoder.step(states)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    copy = old_copy_s(caches, lengths)
    pool = decoder.pool
    assert pool is not None
    row = {
        "streams": n,
        "positions": positions,
        "step_ms": [round(t * 1000, 1) for t in times],
        "step_ms_best": round(min(times) * 1000, 1),
        "old_copy_ms": round(copy * 1000, 1),
        "pool_mib": round(pool.nbytes() / 2**20, 1),
    }
    for state in states:
        decoder.release(state)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", choices=("tiny", "official"), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--llm-dtype", default="float32")
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--streams", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--positions", type=int, default=150)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("artifacts/cosyvoice2_kv"))
    args = parser.parse_args(argv)

    from engine.backends.cosyvoice2 import model_dir
    from engine.backends.cosyvoice2.backend import DTYPES
    from engine.backends.cosyvoice2.streaming import Decoder
    from tests.engine.cosyvoice2.tiny_model import OFFICIAL, TINY, write_model

    body: dict[str, Any] = report.provenance("tests.bench.cosyvoice2_kv", argv)
    with tempfile.TemporaryDirectory(prefix="cosyvoice2-kv-") as scratch:
        directory = args.model_dir or Path(scratch) / "model"
        if not (directory / "cosyvoice2.yaml").exists():
            write_model(directory, OFFICIAL if args.dims == "official" else TINY)
        device = torch.device(args.device)
        model = model_dir.load(directory, device, torch.float32, llm_dtype=DTYPES[args.llm_dtype])
        decoder = Decoder(model)
        rows = []
        for n in args.streams:
            rows.append(measure(decoder, n, args.positions, args.steps))
            print(rows[-1], flush=True)
    body.update(dims=args.dims, device=args.device, llm_dtype=args.llm_dtype, rows=rows)
    lines = [
        report.generated_line(body),
        "",
        *report.provenance_lines(body),
        f"- Model: random weights, {args.dims} dimensions, {args.device}, LLM {args.llm_dtype}; "
        f"about {args.positions} cached positions a stream",
        "",
        "| streams | decode step ms (best of steps) | the old per-step cache copy, ms | pool MiB |",
        "|---:|---:|---:|---:|",
        *(
            f"| {r['streams']} | {r['step_ms_best']} | {r['old_copy_ms']} | {r['pool_mib']} |"
            for r in rows
        ),
    ]
    report.publish(
        args.out,
        "cosyvoice2_kv.json",
        body,
        "\n".join(lines) + "\n",
        docs=Path("docs/cosyvoice2.md"),
        markers=("", ""),
        update_docs=False,
    )


if __name__ == "__main__":
    main()
