"""The engine's scheduler: one coordinator thread owns every stream, lanes do the work.

The package's parts (each with one job):

- ``policy``: the rules below (urgency, a lane's next batch, capacity fit, cutting a
  segment to fit), pure functions of the state, no threads, no clock;
- ``lanes``: where segments are synthesized (inline, or on a batch lane's workers);
- ``cores``: a batch lane's cores, handed out between a segment's pieces (a running call
  gives its core to a newcomer while its audio lasts);
- ``dispatch``: which ready streams a batch lane's next batch takes, in the policy's order;
- ``output``: audio into the rings, boundaries, word timing and the utterance events;
- ``state``: streams, utterances, lanes, and the two things other threads share with
  the coordinator, each behind a lock (the slots' generations, the counters);
- ``channels``, ``commands``: commands (from the server) and results (from the workers,
  the speech cache's lookups), apart;
- ``utterances``: text into an utterance's segments, a cancelled utterance, the start
  deadline;
- ``cache_keys``, ``retention``: the speech cache's keys of a stream's (or a prompt's)
  segments, and what of them may be kept;
- ``cache_path``: the speech cache as streams meet it (look up, join, play, store);
- ``flights``: one synthesis per segment in flight, heard by every stream that asks;
- ``warm``, ``warming``: warm-up jobs (a prompt rendered into the speech cache, no
  stream) and how the coordinator runs them;
- ``coordinator``: :class:`Scheduler`, the loop that ties them together.

The coordinator owns the streams' state (utterances, rings, boundaries, pending audio):
it is the rings' only writer. Each backend has a **lane**:

- a per-segment backend (espeak-ng: not thread-safe, streams audio out as it goes) runs
  in the coordinator itself, one segment at a time, its audio written as it comes;
- a :class:`~engine.backends.base.BatchSynthesizer` (Piper) runs on ``threads`` worker
  threads: the coordinator forms batches of up to ``max_batch`` segments of different
  streams (one model: the backend's ``batch_key``), a free worker runs one, and the audio
  comes back to the coordinator on the results channel, resampled by the worker.

A stream has at most one segment in flight, so its audio stays in order. A segment in
flight for one stream is heard by every other stream that asks for it meanwhile (the same
key): one synthesis (``flights``).

Order: work is done one text segment at a time (a clause or a sentence, at most
:attr:`engine.text.SegmentSplitter.max_segment_chars` characters), in three tiers
(:meth:`policy.Policy.urgency`):

1. streams that are playing and hold less unplayed audio than a reserve (three times
   what their next segment is expected to take, from the lane's recent pace, plus
   0.2 s), the least slack first: audio a caller is already hearing must not stop;
2. new utterances (nothing of them produced, nothing playing): first audio; in a worker
   lane, the one whose first segment most of them wait for first (one synthesis that
   they all hear: engine/scheduler/dispatch.py), then the oldest;
3. streams that are comfortably ahead, the least slack first.

A batch is the most urgent streams of one model. When the engine has spare capacity the
order changes nothing (every tier is served at once); when it is saturated, calls that
are speaking keep speaking and new utterances wait, so the excess shows up as first-audio
latency, which the gateway's admission control sees and acts on (queueing, then
``queue_timeout``), instead of as stutter spread over every call. One long text cannot
starve short prompts, and each utterance's first segment is a short clause.

Capacity: in a lane whose calls are independent (``independent_calls``: Piper), a new
utterance starts only when the lane's measured pace says it fits without any call in
progress (or itself) running out of audio (engine/capacity.py), and a playing stream's
next segment that would come too late at that pace is cut into a piece that fits
(:func:`engine.text.split_to_fit`).

Start deadline: a new utterance that could start (its stream has nothing else playing or
to do first) but has waited ``start_timeout_s`` (``ENGINE_START_TIMEOUT_MS``, 10 s) for
the engine fails with ``queue_timeout``: on an engine saturated for that long, the IVR
gets an error it can act on (a recorded fallback, a transfer) rather than a prompt that
starts any time later. The gateway's own queue (``GATEWAY_QUEUE_TIMEOUT_MS``) refuses
sooner; this bounds what the engine has already accepted.

Back-pressure: audio goes into the stream's outbound ring. When the ring is full the
rest of the segment waits in the stream's ``pending`` buffer, and the stream gets no new
turn until ``pending`` has drained: a full ring never overwrites unread audio.

Speech cache (engine/speech_cache, docs/speech-cache.md "Scheduling"): a segment is
looked up when it becomes its stream's next work, before any capacity cut. A memory hit
is written to the ring by the coordinator at once (never a lane, never counted in the
capacity fit, ``queued_utterances`` or the start deadline); with a shared level, a memory
miss waits on the level's lookup (the stream is in flight meanwhile), then plays or goes
to synthesis. A synthesized segment, complete and not cancelled, is stored with exactly
the bytes its ring got (resampling is per segment) and its words.

Warm-up: a WarmPrompt's segments are looked up and, where missing, synthesized on idle
capacity only (engine/scheduler/warm.py): an inline lane's warm segment is given up as
soon as anything arrives for the coordinator; a worker lane takes one only while no call
has segments for it, leaving a worker free when it has several.

Debugging: with ``ENGINE_PCM_TAP_DIR`` set, every stream's PCM (exactly the bytes put
into its ring, cancelled audio included) is also written to a file there, to hear what a
caller heard.

Thread contract: see engine/scheduler/coordinator.py.
"""

from engine.scheduler.coordinator import START_TIMEOUT_S, Scheduler
from engine.scheduler.output import MAX_WORD_CHARS, EventSink
from engine.scheduler.policy import RESERVE_FACTOR, RESERVE_FLOOR_S
from engine.scheduler.state import SchedulerStats

__all__ = [
    "MAX_WORD_CHARS",
    "RESERVE_FACTOR",
    "RESERVE_FLOOR_S",
    "START_TIMEOUT_S",
    "EventSink",
    "Scheduler",
    "SchedulerStats",
]
