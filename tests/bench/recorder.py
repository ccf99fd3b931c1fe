"""Per-frame bookkeeping of a load-generator process, independent of the wire protocol.

The hot path (:meth:`UtteranceProbe.frame`, once per received audio frame) does a few
float operations and one ``array.append``; statistics are computed once, at the end, by
:mod:`tests.bench.stats`. One :class:`Recorder` per worker process collects what all of
its calls measured; :meth:`Recorder.export` turns it into plain data for the parent.

Definitions (per utterance, times from ``time.monotonic()`` at the client):

- first audio: ``speak`` sent -> first audio frame received;
- gap: arrival of frame *k* minus arrival of frame *k-1* (within one utterance);
- run-ahead of frame *k*: ``k * frame_s - (t_k - t_0)``, how much audio the peer holds
  beyond what a player started at the first frame has consumed. Realtime pacing keeps it
  at most the gateway's lead (60 ms) plus measurement slack;
- late frame: a frame whose run-ahead is below ``-jitter_s``, i.e. one that arrives
  after a player with a jitter buffer of ``jitter_s`` started at the first frame needed
  it: an underrun the caller hears, observed at the client.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class UtteranceProbe:
    """Measures one utterance while it plays; see the module docstring."""

    recorder: Recorder
    utterance_id: str
    t_speak: float
    frames: int = 0
    t0: float = 0.0
    t_prev: float = 0.0
    max_ahead: float = float("-inf")
    min_ahead: float = float("inf")
    late: int = 0
    bad_size: int = 0

    def frame(self, t: float, size: int) -> None:
        """Frame arrived at ``t`` with ``size`` payload bytes (the hot path)."""
        rec = self.recorder
        if size != rec.frame_bytes:
            self.bad_size += 1
        n = self.frames
        if n == 0:
            self.t0 = t
            rec.first_audio.append(t - self.t_speak)
            ahead = 0.0
        else:
            rec.gaps.append(t - self.t_prev)
            ahead = n * rec.frame_s - (t - self.t0)
            if ahead < -rec.jitter_s:
                self.late += 1
        if ahead > self.max_ahead:
            self.max_ahead = ahead
        if ahead < self.min_ahead:
            self.min_ahead = ahead
        self.t_prev = t
        self.frames = n + 1


@dataclass
class Recorder:
    """Everything one worker measured; plain arrays, merged by the parent."""

    frame_s: float = 0.020
    frame_bytes: int = 160
    jitter_s: float = 0.020
    first_audio: array[float] = field(default_factory=lambda: array("d"))
    gaps: array[float] = field(default_factory=lambda: array("d"))
    # per completed utterance: frames, max run-ahead, min run-ahead, late frames
    utt_frames: array[int] = field(default_factory=lambda: array("q"))
    utt_max_ahead: array[float] = field(default_factory=lambda: array("d"))
    utt_min_ahead: array[float] = field(default_factory=lambda: array("d"))
    utt_late: array[int] = field(default_factory=lambda: array("q"))
    server_first_audio_ms: array[float] = field(default_factory=lambda: array("d"))
    # per call: set-up time (telephony legs), RFC 3550 interarrival jitter (RTP legs)
    setup: array[float] = field(default_factory=lambda: array("d"))
    rtp_jitter_ms: array[float] = field(default_factory=lambda: array("d"))
    rtp_packets: int = 0
    rtp_lost: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    speaks: int = 0
    completed: int = 0
    unfinished: int = 0  # speak sent, utterance_done never came (timeout, close, end)
    no_audio: int = 0  # of those, how many never got a single frame
    bad_size_frames: int = 0
    stray_frames: int = 0  # audio outside any utterance
    tail_frames: int = 0  # a leg's silence after each utterance, not measured (jambonz)
    sessions_ready: int = 0
    sessions_failed: int = 0
    calls_completed: int = 0  # ready calls still up, with no failure, when the run ended
    frames: int = 0  # audio frames of completed utterances
    _reported_first_audio: int = 0

    def probe(self, utterance_id: str, t_speak: float) -> UtteranceProbe:
        self.speaks += 1
        return UtteranceProbe(self, utterance_id, t_speak)

    def finish(self, probe: UtteranceProbe, server_first_audio_ms: float | None) -> None:
        """``utterance_done`` arrived for ``probe``'s utterance."""
        self.completed += 1
        self.frames += probe.frames
        self.bad_size_frames += probe.bad_size
        if probe.frames:
            self.utt_frames.append(probe.frames)
            self.utt_max_ahead.append(probe.max_ahead)
            self.utt_min_ahead.append(probe.min_ahead)
            self.utt_late.append(probe.late)
        if server_first_audio_ms is not None:
            self.server_first_audio_ms.append(float(server_first_audio_ms))

    def abandon(self, probe: UtteranceProbe) -> None:
        """``probe``'s utterance never finished (timeout, closed socket, end of run)."""
        self.unfinished += 1
        self.bad_size_frames += probe.bad_size
        if probe.frames == 0:
            self.no_audio += 1

    def error(self, code: str) -> None:
        self.errors[code] += 1

    def progress(self) -> dict[str, Any]:
        """Running totals for the progress line, and the first-audio latencies measured
        since the previous call (so the parent can show a running percentile)."""
        new = self.first_audio[self._reported_first_audio :].tolist()
        self._reported_first_audio = len(self.first_audio)
        return {
            "speaks": self.speaks,
            "completed": self.completed,
            "frames": self.frames,
            "errors": sum(self.errors.values()),
            "ready": self.sessions_ready,
            "failed": self.sessions_failed,
            "first_audio_new": new,
        }

    def export(self) -> dict[str, Any]:
        """Plain data (bytes and ints) to send to the parent process."""
        return {
            "first_audio": self.first_audio.tobytes(),
            "gaps": self.gaps.tobytes(),
            "utt_frames": self.utt_frames.tobytes(),
            "utt_max_ahead": self.utt_max_ahead.tobytes(),
            "utt_min_ahead": self.utt_min_ahead.tobytes(),
            "utt_late": self.utt_late.tobytes(),
            "server_first_audio_ms": self.server_first_audio_ms.tobytes(),
            "setup": self.setup.tobytes(),
            "rtp_jitter_ms": self.rtp_jitter_ms.tobytes(),
            "rtp_packets": self.rtp_packets,
            "rtp_lost": self.rtp_lost,
            "errors": dict(self.errors),
            "speaks": self.speaks,
            "completed": self.completed,
            "unfinished": self.unfinished,
            "no_audio": self.no_audio,
            "bad_size_frames": self.bad_size_frames,
            "stray_frames": self.stray_frames,
            "tail_frames": self.tail_frames,
            "sessions_ready": self.sessions_ready,
            "sessions_failed": self.sessions_failed,
            "calls_completed": self.calls_completed,
            "frames": self.frames,
        }
