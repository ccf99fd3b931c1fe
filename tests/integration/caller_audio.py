"""Caller audio for duplex tests: speech made with espeak in another voice, noise, DTMF."""

from __future__ import annotations

import numpy as np

from telephony.codecs.resample import StreamingResampler

RATE = 8000


def espeak_speech(text: str = "Hello, I would like to talk to an agent please.") -> np.ndarray:
    """16-bit speech at 8 kHz, from espeak-ng (female variant) in a child process.

    espeak allows one instance per process, and the test process may already hold one,
    so it runs in a short-lived subprocess.
    """
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from engine.backends.espeak import EspeakBackend\n"
        "from engine.backends.base import VoiceSettings\n"
        "b = EspeakBackend(); chunks = []\n"
        "b.synthesize(sys.argv[1], b.resolve_voice(VoiceSettings('en-us-f')),"
        " lambda c: chunks.append(c) or True)\n"
        "sys.stdout.buffer.write(np.concatenate(chunks).tobytes())\n"
    )
    raw = subprocess.run(
        [sys.executable, "-c", code, text], capture_output=True, check=True, timeout=60
    ).stdout
    resampler = StreamingResampler(22050, RATE)
    pcm = resampler.process(raw) + resampler.flush()
    return np.frombuffer(pcm, dtype="<i2").copy()


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(RATE * seconds), dtype=np.int16)


def white_noise(seconds: float, rms: float = 1000.0, seed: int = 7) -> np.ndarray:
    """White noise at ``rms`` (1000 is about -30 dBFS: a noisy line)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(RATE * seconds)) * rms).clip(-32768, 32767).astype(np.int16)


DTMF_FREQUENCIES = {
    "1": (697, 1209), "2": (697, 1336), "3": (697, 1477),
    "4": (770, 1209), "5": (770, 1336), "6": (770, 1477),
    "7": (852, 1209), "8": (852, 1336), "9": (852, 1477),
    "*": (941, 1209), "0": (941, 1336), "#": (941, 1477),
}  # fmt: skip


def dtmf(
    digits: str, tone_s: float = 0.15, gap_s: float = 0.1, level: float = 8000.0
) -> np.ndarray:
    """DTMF tones (ITU-T Q.23 frequency pairs) at a normal level (-12 dBFS per tone)."""
    t = np.arange(int(RATE * tone_s)) / RATE
    parts = []
    for digit in digits:
        low, high = DTMF_FREQUENCIES[digit]
        tone = 0.5 * level * (np.sin(2 * np.pi * low * t) + np.sin(2 * np.pi * high * t))
        parts += [tone.astype(np.int16), silence(gap_s)]
    return np.concatenate(parts)


def frames(pcm: np.ndarray, samples: int = 160) -> list[np.ndarray]:
    """20 ms frames (zero-padded at the end)."""
    pad = (-len(pcm)) % samples
    padded = np.concatenate([pcm, np.zeros(pad, dtype=np.int16)])
    return [padded[i : i + samples] for i in range(0, len(padded), samples)]


def espeak_reference(
    voice: str = "en-us+f3",
    pitch: int = 70,
    *,
    seconds: float = 6.0,
    rate_wpm: int = 175,
    text: str = (
        "Thank you for calling the customer service centre. Your call is important to us, "
        "and one of our agents will be with you shortly. Please have your account number ready."
    ),
) -> tuple[np.ndarray, int]:
    """Reference speech for voice registration: espeak-ng at a chosen pitch (0..100),
    repeated to at least ``seconds``; returns (int16 samples, 22050)."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from engine.backends.espeak import EspeakBackend, EspeakVoice\n"
        "b = EspeakBackend(); chunks = []\n"
        "v = EspeakVoice(sys.argv[2], rate_wpm=int(sys.argv[4]), pitch=int(sys.argv[3]),"
        " pitch_range=50)\n"
        "b.synthesize(sys.argv[1], v, lambda c: chunks.append(c) or True)\n"
        "sys.stdout.buffer.write(np.concatenate(chunks).tobytes())\n"
    )
    raw = subprocess.run(
        [sys.executable, "-c", code, text, voice, str(pitch), str(rate_wpm)],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    pcm = np.frombuffer(raw, dtype="<i2")
    reps = int(np.ceil(seconds * 22050 / max(1, len(pcm))))
    return np.tile(pcm, reps), 22050


def wav_bytes(pcm: np.ndarray, rate: int, fmt: str = "WAV") -> bytes:
    """Encode int16 samples as a WAV/FLAC/OGG file in memory (soundfile)."""
    import io

    import soundfile as sf  # type: ignore[import-untyped]

    out = io.BytesIO()
    sf.write(out, pcm, rate, format=fmt, subtype="PCM_16" if fmt in ("WAV", "FLAC") else None)
    return out.getvalue()


def level_dbfs(pcm: np.ndarray) -> float:
    """RMS level of 16-bit PCM in dBFS (speech from these voices sits around -20)."""
    rms = float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2)))
    return float(20 * np.log10(max(rms, 1e-9) / 32768))
