"""Reference audio for voice registration (``POST /v1/voices``): bytes in, result out.

A call centre registers a voice from a few seconds of its reference speaker.
:func:`process_reference` turns the uploaded bytes into normalized reference audio
(:class:`ReferenceAudio`: 16-bit little-endian mono PCM at 16 kHz) or raises a
:class:`ReferenceAudioError` whose ``code`` and ``message`` go to the client as they
are. The module is sans-I/O: it decodes from an in-memory buffer, touches no disk,
network or event loop and keeps no state, so a failure leaves nothing half-done and
the same bytes always give the same PCM and the same ``sha256``. It is CPU-bound
(for a 30 s upload about 50-100 ms from WAV, FLAC or MP3 and about 0.3 s from Opus on
one core): an async caller should run it in an executor.

Pipeline and the values chosen (every threshold is a module constant):

1. **Size.** More than ``max_bytes`` (default :data:`MAX_UPLOAD_BYTES`, 10 MiB) is
   ``audio_too_large`` with HTTP 413; :func:`check_upload_size` lets the caller refuse
   on ``Content-Length`` before reading the body. Empty input is ``invalid_audio``.
2. **Decode** with libsndfile (``soundfile``), which detects the container from the
   bytes themselves, not from a file name or MIME type. Accepted containers: WAV
   (including WAVE_FORMAT_EXTENSIBLE, reported as ``"WAV"``, with any codec
   libsndfile decodes: PCM 8/16/24/32-bit, float, G.711 mu-law/A-law, ADPCM), FLAC,
   OGG (Opus or Vorbis) and MP3. Anything libsndfile cannot open or decode
   (text, images, random bytes, truncated headers, corrupt streams, non-finite float
   samples) and any other container it happens to understand (AIFF, AU, CAF, ...)
   is ``invalid_audio``. Source rates from :data:`MIN_SOURCE_RATE` (8 kHz, telephone
   band: less cannot carry speech intelligibly) to :data:`MAX_SOURCE_RATE`
   (192 kHz) and 1 to :data:`MAX_CHANNELS` (8) channels are accepted.
3. **Early length limit.** Decoding stops, and the upload is ``audio_too_long``,
   once more than :data:`MAX_DECODE_S` (120 s) has been decoded, whatever the header
   claims. 10 MiB of low-bitrate MP3 or of FLAC silence can hold hours of audio, so
   this bounds time and memory (decoding is blockwise: mixdown and resampling run per
   block, so memory stays at the 16 kHz mono size plus one byte per source frame for
   the clipping mask).
4. **Mix to mono** by averaging the channels, **resample** to 16 kHz with libsoxr
   ("HQ", the same quality the telephony resampler uses) and remove DC offset
   (subtract the mean), which would otherwise bias the frame energies.
5. **Voice activity** (energy-based, on 20 ms frames of the 16 kHz signal; speech is
   quasi-stationary over 20-30 ms, the frame size of common VADs such as WebRTC's):

   * noise floor = 10th percentile of the frame energies (a low-percentile
     "minimum statistics" estimate, after R. Martin, IEEE Trans. Speech Audio Proc.
     9(5), 2001), so a recording needs no leading silence for the floor to be found;
   * a frame is *active* when its RMS is more than :data:`SPEECH_MARGIN_DB` (12 dB)
     above that floor **and** above :data:`SPEECH_FLOOR_DBFS` (-50 dBFS). The frame
     energy of stationary noise varies by well under 1 dB between 20 ms frames
     (chi-square with 320 degrees of freedom, sigma about 0.35 dB), and HVAC or line
     noise by a few dB, so steady noise stays below the margin, while voiced speech in
     a usable recording sits 20-40 dB above its noise. Speech that never gets above
     -50 dBFS would need more than 30 dB of gain, raising the noise with it;
   * gaps shorter than :data:`BRIDGE_GAP_MS` (250 ms) between active frames are
     counted as speech: 250 ms is the classic minimum for a silent pause in
     speech (F. Goldman-Eisler, *Psycholinguistics*, 1968); shorter gaps are stop
     closures and word boundaries, and weak consonants below the margin are
     covered the same way. Runs shorter than :data:`MIN_SEGMENT_MS` (100 ms,
     shorter than any syllable) are dropped as clicks and bumps;
   * ``speech_ms`` is the total length of the remaining speech segments.

6. **Checks**, in this order (the first failure is reported):

   * ``no_speech``: less than :data:`NO_SPEECH_BELOW_MS` (200 ms, about one
     syllable) of speech: silence, steady noise or hum, a click;
   * ``audio_too_short``: less than :data:`MIN_SPEECH_S` (3 s) of speech. This comes
     before the length limit because cropping cannot fix it. When even the loudest
     frame is under :data:`QUIET_BELOW_DBFS` (-35 dBFS) the message adds that the
     recording is very quiet, since then quiet syllables may have fallen under the
     -50 dBFS floor;
   * ``audio_too_long``: the **trimmed** audio (step 7) is longer than
     :data:`MAX_DURATION_S` (30 s); leading and trailing silence does not count;
   * ``audio_clipped``: within the trimmed span, on the decoded source samples
     (before mixdown, resampling and gain; a frame counts when any channel does),
     more than :data:`CLIP_FRACTION_MAX` (1 %) of the frames sit at full scale, or one
     run of consecutive full-scale frames lasts :data:`CLIP_RUN_MAX_MS` (10 ms) or
     more. "Full scale" is within one 16-bit LSB of the largest code (for 8-bit PCM:
     within one 8-bit LSB; for G.711: the largest mu-law/A-law code, since those never
     reach 32767; for float data: within one 16-bit LSB of +-1.0, values beyond that
     are loud but not clipped). A clean recording normalized to 0 dBFS touches full
     scale on a handful of peaks (far below 1 %); 1 % of the speech span at the rail
     is audible distortion. A 10 ms flat top is longer than a whole pitch period of
     any voice (2.5-10 ms for 100-400 Hz), which only a saturated input or a rail/DC
     fault produces.

7. **Trim** leading and trailing silence, keeping :data:`TRIM_PAD_MS` (100 ms) of
   padding around the first and last speech segments so weak onsets and releases
   (/f/, /h/, final stops) that the energy detector misses are kept. Silence between
   words is kept.
8. **Normalize loudness**: scale so that the RMS over the active speech frames is
   :data:`TARGET_LOUDNESS_DBFS` (-20 dBFS), but never let the sample peak exceed
   :data:`PEAK_LIMIT_DBFS` (-1 dBFS, the maximum true-peak level of EBU R 128 /
   EBU Tech 3343, also the usual headroom for later lossy coding); when the peak
   would exceed it, the gain is lowered instead (no limiter, no compression), so
   ``loudness_dbfs`` is then below the target. Measuring the level over active
   frames only follows the idea of the ITU-T P.56 active speech level. Speech with
   the usual 12-18 dB peak-to-active-RMS ratio lands near both limits at once.
   Samples are rounded to 16 bits without dither so the output is deterministic.

Levels in dBFS are ``20*log10(x)`` with full scale 1.0 (32768 in 16-bit): a
full-scale square wave is 0 dBFS and a full-scale sine reads -3.01 dBFS (not the
AES17 sine-referenced convention). ``peak_dbfs`` and ``loudness_dbfs`` are measured
on the returned 16-bit PCM.

``sha256`` is the hex digest of ``pcm``, the cache key of the normalized audio: the
same upload always gives the same key. The same recording uploaded at another sample
rate or in a lossy format decodes to other samples and so another key.

Limitation: libmpg123 (inside libsndfile) prints resync notes for corrupt MP3 data
to the process's stderr; that is the C library's own output and cannot be routed
through Python logging without redirecting the file descriptor.
"""

from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass, field
from typing import Final, Literal

import numpy as np
import numpy.typing as npt
import soundfile as sf  # type: ignore[import-untyped]
import soxr

__all__ = [
    "BRIDGE_GAP_MS",
    "CLIP_FRACTION_MAX",
    "CLIP_RUN_MAX_MS",
    "FRAME_MS",
    "MAX_CHANNELS",
    "MAX_DECODE_S",
    "MAX_DURATION_S",
    "MAX_SOURCE_RATE",
    "MAX_UPLOAD_BYTES",
    "MIN_SEGMENT_MS",
    "MIN_SOURCE_RATE",
    "MIN_SPEECH_S",
    "NOISE_PERCENTILE",
    "NO_SPEECH_BELOW_MS",
    "PEAK_LIMIT_DBFS",
    "QUIET_BELOW_DBFS",
    "SPEECH_FLOOR_DBFS",
    "SPEECH_MARGIN_DB",
    "TARGET_LOUDNESS_DBFS",
    "TARGET_RATE",
    "TRIM_PAD_MS",
    "ReferenceAudio",
    "ReferenceAudioError",
    "RejectionCode",
    "check_upload_size",
    "process_reference",
]

MAX_UPLOAD_BYTES: Final = 10 * 2**20
TARGET_RATE: Final = 16000
MIN_SPEECH_S: Final = 3.0
MAX_DURATION_S: Final = 30.0
MAX_DECODE_S: Final = 120.0

MIN_SOURCE_RATE: Final = 8000
MAX_SOURCE_RATE: Final = 192000
MAX_CHANNELS: Final = 8

FRAME_MS: Final = 20
NOISE_PERCENTILE: Final = 10.0
SPEECH_MARGIN_DB: Final = 12.0
SPEECH_FLOOR_DBFS: Final = -50.0
QUIET_BELOW_DBFS: Final = -35.0  # loudest frame under this: say so in audio_too_short
BRIDGE_GAP_MS: Final = 250
MIN_SEGMENT_MS: Final = 100
NO_SPEECH_BELOW_MS: Final = 200
TRIM_PAD_MS: Final = 100

CLIP_FRACTION_MAX: Final = 0.01
CLIP_RUN_MAX_MS: Final = 10.0

TARGET_LOUDNESS_DBFS: Final = -20.0
PEAK_LIMIT_DBFS: Final = -1.0

RejectionCode = Literal[
    "invalid_audio",
    "audio_too_short",
    "audio_too_long",
    "no_speech",
    "audio_clipped",
    "audio_too_large",
]

# Container names as libsndfile reports them -> the name given to the client.
_ACCEPTED_FORMATS: Final = {
    "WAV": "WAV",
    "WAVEX": "WAV",
    "FLAC": "FLAC",
    "OGG": "OGG",
    "MP3": "MP3",
}
_FULL_SCALE: Final = 32768.0
_LSB16: Final = 1.0 / _FULL_SCALE
_BLOCK_FRAMES: Final = 1 << 16
_FRAME: Final = TARGET_RATE * FRAME_MS // 1000
_ENERGY_EPS: Final = 1e-12  # -120 dBFS: the level given to digital silence


class ReferenceAudioError(ValueError):
    """Rejected reference audio: ``code`` and ``message`` are for the client as they are.

    ``http_status`` is 413 for ``audio_too_large`` and 400 for every other code. Any
    decoder exception is chained as ``__cause__`` for the server log; it never
    reaches ``message``.
    """

    def __init__(self, code: RejectionCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code: RejectionCode = code
        self.message = message
        self.http_status = 413 if code == "audio_too_large" else 400


@dataclass(frozen=True, slots=True, kw_only=True)
class ReferenceAudio:
    """Normalized reference audio: 16-bit little-endian mono PCM at 16 kHz."""

    pcm: bytes = field(repr=False)
    sample_rate: int = TARGET_RATE
    duration_ms: int  # of ``pcm``, after trimming
    speech_ms: int
    source_format: str  # "WAV", "FLAC", "OGG" or "MP3"
    source_rate: int
    source_channels: int
    peak_dbfs: float  # sample peak of ``pcm``
    loudness_dbfs: float  # RMS of the active speech frames of ``pcm``
    sha256: str  # hex digest of ``pcm``


def check_upload_size(size: int, *, max_bytes: int = MAX_UPLOAD_BYTES) -> None:
    """Raise ``audio_too_large`` (HTTP 413) when an upload of ``size`` bytes is over the limit.

    For the caller to use on ``Content-Length`` or while streaming the body, before
    anything is decoded; :func:`process_reference` applies the same check.
    """
    if size > max_bytes:
        raise ReferenceAudioError(
            "audio_too_large",
            f"the audio upload is {_format_bytes(size)}; the limit is {_format_bytes(max_bytes)}",
        )


def process_reference(
    data: bytes | bytearray | memoryview, *, max_bytes: int = MAX_UPLOAD_BYTES
) -> ReferenceAudio:
    """Decode, check and normalize an uploaded reference recording.

    Raises :class:`ReferenceAudioError` with the first problem found (see the module
    docstring for the order and thresholds). ``data`` is only read; a ``bytearray``
    (what aiohttp's ``BodyPartReader.read()`` returns) or ``memoryview`` is accepted
    as well as ``bytes``.
    """
    check_upload_size(
        data.nbytes if isinstance(data, memoryview) else len(data), max_bytes=max_bytes
    )
    raw = bytes(data)  # no copy for bytes; a private snapshot of a mutable buffer
    if not raw:
        raise ReferenceAudioError("invalid_audio", "the audio upload is empty")

    decoded = _decode(raw)
    signal = decoded.mono16k - np.float32(decoded.mono16k.mean())

    frame_db = _frame_levels(signal)
    active = _active_frames(frame_db)
    speech = _speech_segments(active)
    speech_ms = int(speech.sum()) * FRAME_MS
    if speech_ms < NO_SPEECH_BELOW_MS:
        raise ReferenceAudioError(
            "no_speech",
            "no speech was found in the audio (it is silent, too quiet, or only noise)",
        )
    if speech_ms < MIN_SPEECH_S * 1000:
        quiet = float(frame_db.max()) < QUIET_BELOW_DBFS
        raise ReferenceAudioError(
            "audio_too_short",
            f"the audio has {speech_ms / 1000:.1f} s of speech; "
            f"at least {MIN_SPEECH_S:g} s is needed"
            + ("; the recording is very quiet, so raise the input gain" if quiet else ""),
        )

    speech_idx = np.flatnonzero(speech)
    pad = TARGET_RATE * TRIM_PAD_MS // 1000
    start = max(0, int(speech_idx[0]) * _FRAME - pad)
    end = min(signal.size, (int(speech_idx[-1]) + 1) * _FRAME + pad)
    duration_ms = (end - start) * 1000 // TARGET_RATE
    if duration_ms > MAX_DURATION_S * 1000:
        raise ReferenceAudioError(
            "audio_too_long",
            f"the audio is {duration_ms / 1000:.1f} s long after trimming silence; "
            f"the limit is {MAX_DURATION_S:g} s",
        )

    _check_clipping(decoded, start, end)

    # Frames that both passed the energy test and belong to a kept speech segment;
    # ``start`` is on the frame grid (pad is a whole number of frames).
    level_frames = np.flatnonzero(active & speech) - start // _FRAME
    trimmed = signal[start:end].astype(np.float64)
    pcm16 = _normalize(trimmed, level_frames)

    pcm = pcm16.astype("<i2").tobytes()
    peak = int(np.abs(pcm16.astype(np.int32)).max())
    return ReferenceAudio(
        pcm=pcm,
        duration_ms=duration_ms,
        speech_ms=speech_ms,
        source_format=decoded.source_format,
        source_rate=decoded.source_rate,
        source_channels=decoded.source_channels,
        peak_dbfs=round(_dbfs(peak / _FULL_SCALE), 2),
        loudness_dbfs=round(_dbfs(_frames_rms(pcm16 / _FULL_SCALE, level_frames)), 2),
        sha256=hashlib.sha256(pcm).hexdigest(),
    )


@dataclass(frozen=True, slots=True)
class _Decoded:
    mono16k: npt.NDArray[np.float32]
    clip_mask: npt.NDArray[np.bool_]  # per source frame: any channel at full scale
    source_format: str
    source_rate: int
    source_channels: int


def _decode(data: bytes) -> _Decoded:
    """Decode blockwise to 16 kHz mono float32, recording full-scale source frames."""
    try:
        with sf.SoundFile(io.BytesIO(data)) as snd:
            container = str(snd.format)
            subtype = str(snd.subtype)
            rate = int(snd.samplerate)
            channels = int(snd.channels)
            source_format = _ACCEPTED_FORMATS.get(container)
            if source_format is None:
                raise ReferenceAudioError(
                    "invalid_audio",
                    f"{container} audio is not accepted; upload WAV, FLAC, OGG (Opus) or MP3",
                )
            if not MIN_SOURCE_RATE <= rate <= MAX_SOURCE_RATE:
                raise ReferenceAudioError(
                    "invalid_audio",
                    f"the sample rate {rate} Hz is not supported; "
                    f"use {MIN_SOURCE_RATE}-{MAX_SOURCE_RATE} Hz",
                )
            if not 1 <= channels <= MAX_CHANNELS:
                raise ReferenceAudioError(
                    "invalid_audio",
                    f"audio with {channels} channels is not supported; "
                    f"use 1 to {MAX_CHANNELS} channels (mono is best)",
                )
            return _read_blocks(snd, source_format, subtype, rate, channels)
    except ReferenceAudioError:
        raise
    except (sf.SoundFileError, RuntimeError) as exc:
        raise ReferenceAudioError(
            "invalid_audio",
            "the upload could not be decoded as audio; "
            "upload WAV, FLAC, OGG (Opus) or MP3 (is the file complete?)",
        ) from exc


def _read_blocks(
    snd: sf.SoundFile, source_format: str, subtype: str, rate: int, channels: int
) -> _Decoded:
    low, high = _clip_band(subtype)
    limit = int(MAX_DECODE_S * rate)
    resampler = (
        None
        if rate == TARGET_RATE
        else soxr.ResampleStream(rate, TARGET_RATE, 1, dtype="float32", quality="HQ")
    )
    mono_parts: list[npt.NDArray[np.float32]] = []
    clip_parts: list[npt.NDArray[np.bool_]] = []
    total = 0
    while True:
        block: npt.NDArray[np.float32] = snd.read(_BLOCK_FRAMES, dtype="float32", always_2d=True)
        if block.shape[0] == 0:
            break
        total += block.shape[0]
        if total > limit:
            raise ReferenceAudioError(
                "audio_too_long",
                f"the audio is longer than {MAX_DECODE_S:g} s; "
                f"the limit is {MAX_DURATION_S:g} s of audio after trimming silence",
            )
        if not np.isfinite(block).all():
            raise ReferenceAudioError(
                "invalid_audio", "the audio contains invalid (non-finite) samples"
            )
        magnitude = np.abs(block)
        at_rail: npt.NDArray[np.bool_] = (magnitude >= low) & (magnitude <= high)
        clip_parts.append(np.asarray(at_rail.any(axis=1), dtype=np.bool_))
        mono = block.mean(axis=1, dtype=np.float32)
        mono_parts.append(mono if resampler is None else resampler.resample_chunk(mono))
    if total == 0:
        raise ReferenceAudioError("invalid_audio", "the audio file contains no samples")
    if resampler is not None:
        mono_parts.append(resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
    return _Decoded(
        mono16k=np.concatenate(mono_parts).astype(np.float32, copy=False),
        clip_mask=np.concatenate(clip_parts),
        source_format=source_format,
        source_rate=rate,
        source_channels=channels,
    )


def _clip_band(subtype: str) -> tuple[float, float]:
    """Magnitudes (as libsndfile's float output) that count as full scale for ``subtype``."""
    if subtype in ("PCM_U8", "PCM_S8"):
        return 126.0 / 128.0, math.inf  # within one 8-bit LSB of 127/128 (or -1)
    if subtype == "ULAW":
        return 32124.0 / _FULL_SCALE, math.inf  # the largest mu-law code (G.711)
    if subtype == "ALAW":
        return 32256.0 / _FULL_SCALE, math.inf  # the largest A-law code (G.711)
    if subtype in ("FLOAT", "DOUBLE"):
        return 1.0 - 2 * _LSB16, 1.0 + _LSB16  # beyond 1.0 is loud, not clipped
    # 16/24/32-bit PCM, lossy codecs (whose decoders overshoot a clipped input), ADPCM
    return 1.0 - 2 * _LSB16, math.inf


def _frame_levels(signal: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """RMS level in dBFS of each whole 20 ms frame (a trailing partial frame is ignored)."""
    count = signal.size // _FRAME
    frames = signal[: count * _FRAME].astype(np.float64).reshape(count, _FRAME)
    power = np.mean(frames * frames, axis=1)
    levels: npt.NDArray[np.float64] = 10.0 * np.log10(power + _ENERGY_EPS)
    return levels


def _active_frames(frame_db: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
    if frame_db.size == 0:
        return np.zeros(0, dtype=np.bool_)
    floor = float(np.percentile(frame_db, NOISE_PERCENTILE))
    threshold = max(floor + SPEECH_MARGIN_DB, SPEECH_FLOOR_DBFS)
    active: npt.NDArray[np.bool_] = frame_db > threshold
    return active


def _runs(mask: npt.NDArray[np.bool_]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Start and end (exclusive) indices of the runs of True in ``mask``."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def _speech_segments(active: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """Active frames with short gaps bridged and short bursts dropped."""
    speech = active.copy()
    starts, ends = _runs(active)
    max_gap = -(-BRIDGE_GAP_MS // FRAME_MS) - 1  # gaps shorter than BRIDGE_GAP_MS
    for gap_start, gap_end in zip(ends[:-1], starts[1:], strict=True):
        if gap_end - gap_start <= max_gap:
            speech[gap_start:gap_end] = True
    min_len = -(-MIN_SEGMENT_MS // FRAME_MS)
    for seg_start, seg_end in zip(*_runs(speech), strict=True):
        if seg_end - seg_start < min_len:
            speech[seg_start:seg_end] = False
    return speech


def _check_clipping(decoded: _Decoded, start: int, end: int) -> None:
    """``audio_clipped`` when the source frames behind ``[start, end)`` at 16 kHz clip."""
    rate = decoded.source_rate
    src_start = start * rate // TARGET_RATE
    src_end = min(decoded.clip_mask.size, -(-end * rate // TARGET_RATE))
    mask = decoded.clip_mask[src_start:src_end]
    if mask.size == 0 or not mask.any():
        return
    fraction = float(np.count_nonzero(mask)) / mask.size
    run_starts, run_ends = _runs(mask)
    longest_ms = float((run_ends - run_starts).max()) * 1000.0 / rate
    if fraction > CLIP_FRACTION_MAX or longest_ms >= CLIP_RUN_MAX_MS:
        raise ReferenceAudioError(
            "audio_clipped",
            f"the recording is clipped ({fraction:.1%} of the speech at full scale, "
            f"longest flat run {longest_ms:.1f} ms); record again with less input gain",
        )


def _normalize(
    trimmed: npt.NDArray[np.float64], level_frames: npt.NDArray[np.intp]
) -> npt.NDArray[np.int16]:
    """Scale the active speech RMS to the target, keeping the peak under the limit."""
    rms = _frames_rms(trimmed, level_frames)
    peak = float(np.abs(trimmed).max())
    gain = 10.0 ** (TARGET_LOUDNESS_DBFS / 20.0) / rms
    # Largest 16-bit code at or under the peak limit, so rounding cannot cross it.
    peak_code = math.floor(_FULL_SCALE * 10.0 ** (PEAK_LIMIT_DBFS / 20.0))
    gain = min(gain, peak_code / (peak * _FULL_SCALE))
    scaled = np.rint(trimmed * (gain * _FULL_SCALE))
    out: npt.NDArray[np.int16] = np.clip(scaled, -peak_code, peak_code).astype(np.int16)
    return out


def _frames_rms(samples: npt.NDArray[np.float64], frames: npt.NDArray[np.intp]) -> float:
    """RMS over the given 20 ms frames of ``samples``."""
    index = frames[:, None] * _FRAME + np.arange(_FRAME)
    selected = samples[index]
    return math.sqrt(float(np.mean(selected * selected)))


def _dbfs(amplitude: float) -> float:
    return 20.0 * math.log10(max(amplitude, 1e-10))


def _format_bytes(size: int) -> str:
    if size >= 2**20:
        return f"{size / 2**20:.1f} MiB"
    if size >= 2**10:
        return f"{size / 2**10:.1f} KiB"
    return f"{size} bytes"
