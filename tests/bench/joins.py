"""Measures of audio joined from pieces against the same audio made whole (sans-I/O).

- :func:`snr_db`: waveform signal-to-noise ratio of a rendering against a reference.
- :func:`spectral_snr_db` and :func:`log_spectral_distance_db`: the same on magnitude
  spectra (20 ms windows, 10 ms hop), blind to phase: a model whose output moves with
  float rounding (Kokoro's harmonic source) scores low on the waveform yet alike here.
- :func:`level_step_db`: the level change across a join (20 ms each side) against the
  reference's change at the same place.
- :func:`clicks`: a click detector: at each place asked, the peak of the second
  difference within :data:`CLICK_HALF` samples against its RMS over the
  :data:`CLICK_CONTEXT` samples either side beyond that; a click when it is
  :data:`CLICK_RATIO` times that and above :data:`CLICK_FLOOR` (full scale 1.0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

CLICK_HALF: Final = 48  # samples (2 ms at 24 kHz) each side of the place looked at
CLICK_CONTEXT: Final = 240  # samples (10 ms) each side beyond that: the reference
CLICK_RATIO: Final = 6.0
CLICK_FLOOR: Final = 1e-3
STEP_WINDOW: Final = 480  # samples (20 ms at 24 kHz)
STEP_FLOOR: Final = 1e-6  # power (-60 dBFS): quieter is silence to the level step

Audio = npt.NDArray[np.floating]


def _power(x: Audio) -> float:
    return float(np.mean(np.square(np.asarray(x, dtype=np.float64)))) if x.size else 0.0


def snr_db(rendering: Audio, reference: Audio) -> float:
    """``reference``'s power over the power of their difference, in dB."""
    n = min(rendering.size, reference.size)
    noise = _power(np.asarray(rendering[:n], np.float64) - reference[:n])
    return float(10 * np.log10(_power(reference[:n]) / max(noise, 1e-30)))


def _spectra(x: Audio, window: int = 480, hop: int = 240) -> npt.NDArray[np.float64]:
    x = np.asarray(x, dtype=np.float64)
    if x.size < window:
        x = np.pad(x, (0, window - x.size))
    frames = np.lib.stride_tricks.sliding_window_view(x, window)[::hop]
    return np.asarray(np.abs(np.fft.rfft(frames * np.hanning(window), axis=1)), np.float64)


def spectral_snr_db(rendering: Audio, reference: Audio) -> float:
    """:func:`snr_db` of the magnitude spectra."""
    n = min(rendering.size, reference.size)
    a, b = _spectra(rendering[:n]), _spectra(reference[:n])
    return float(10 * np.log10(np.sum(b**2) / max(float(np.sum((a - b) ** 2)), 1e-30)))


def log_spectral_distance_db(rendering: Audio, reference: Audio, range_db: float = 50) -> float:
    """Mean over the reference's windows within ``range_db`` of its loudest of the RMS dB
    difference of the two magnitude spectra."""
    n = min(rendering.size, reference.size)
    a, b = _spectra(rendering[:n]) + 1e-5, _spectra(reference[:n]) + 1e-5
    loud = 20 * np.log10(b.max(axis=1))
    keep = loud > loud.max() - range_db
    diff = 20 * np.log10(a[keep] / b[keep])
    return float(np.mean(np.sqrt(np.mean(diff**2, axis=1))))


def level_step_db(rendering: Audio, reference: Audio, at: int, window: int = STEP_WINDOW) -> float:
    """|the level change across ``at`` in ``rendering`` less the one in ``reference``|
    (dB, ``window`` samples each side, levels below :data:`STEP_FLOOR` counted as it: a
    change between silences is none); 0 where either side is cut short."""
    if at - window < 0 or at + window > min(rendering.size, reference.size):
        return 0.0

    def change(x: Audio) -> float:
        after, before = _power(x[at : at + window]), _power(x[at - window : at])
        return float(10 * np.log10(max(after, STEP_FLOOR) / max(before, STEP_FLOOR)))

    return abs(change(rendering) - change(reference))


def clicks(audio: Audio, places: Sequence[int]) -> int:
    """How many of ``places`` (sample indices) hold a click (the module docstring)."""
    x = np.asarray(audio, dtype=np.float64)
    second = np.zeros_like(x)
    second[2:] = x[2:] - 2 * x[1:-1] + x[:-2]
    count = 0
    for at in places:
        near = np.abs(second[max(0, at - CLICK_HALF) : at + CLICK_HALF])
        around = np.concatenate(
            [
                second[max(0, at - CLICK_HALF - CLICK_CONTEXT) : max(0, at - CLICK_HALF)],
                second[at + CLICK_HALF : at + CLICK_HALF + CLICK_CONTEXT],
            ]
        )
        if not near.size:
            continue
        reference = float(np.sqrt(np.mean(around**2))) if around.size else 0.0
        if near.max() > max(CLICK_RATIO * reference, CLICK_FLOOR):
            count += 1
    return count
