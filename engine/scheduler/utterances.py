"""A stream's utterances as the coordinator receives them: text into segments (the
stream's splitter, the cache's keys, what may be kept), a cancelled utterance, the start
deadline of a new one, and voice preparation for the backend. Coordinator thread only."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from engine.backends.base import BackendError, VoicePreparer
from engine.backends.routing import BackendSet
from engine.ipc.schema import Message, VoicePrepared, VoicePrepareFailed
from engine.scheduler import commands, policy
from engine.scheduler.cache_keys import key_maker
from engine.scheduler.output import OutputWriter
from engine.scheduler.state import Stream, Utterance
from engine.speech_cache import SpeechCache
from engine.text import stream_splitter

log = logging.getLogger(__name__)


class Utterances:
    def __init__(
        self,
        backends: BackendSet,
        cache: SpeechCache,
        output: OutputWriter,
        *,
        max_text_chars: int,
        start_timeout_s: float,
    ) -> None:
        self._backends = backends
        self._cache = cache
        self._output = output
        self._max_text_chars = max_text_chars
        self._start_timeout_s = start_timeout_s

    def accept(self, stream: Stream, command: commands.Speak) -> None:
        """Text for an utterance of ``stream``: a new utterance (its own style
        instruction, its own ``cache``), or more of the last one; its segments queued,
        those carrying personal data and the words cut off before them marked, and those
        the memory level holds now noted for the capacity fit."""
        if command.utterance in stream.failed:
            return  # more text for an utterance that already failed
        utterance = stream.utterances[-1] if stream.utterances else None
        if utterance is None or utterance.seq != command.utterance or utterance.final:
            utterance = Utterance(command.utterance, stream_splitter(stream.voice.language))
            utterance.keys = stream.keys
            utterance.retain = stream.retain if command.retain is None else command.retain
            stream.utterances.append(utterance)
            if command.instruct:
                settings = replace(stream.voice.settings, instruct=command.instruct)
                try:
                    utterance.handle = self._backends.resolve_voice(settings).handle
                except BackendError as exc:
                    self._output.fail(stream, utterance, exc.code, exc.message)
                    return
                if stream.keys is not None:
                    utterance.keys = key_maker(
                        stream.voice, utterance.handle, command.instruct, stream.sample_rate,
                        scope=stream.scope, voice_digest=stream.voice_digest,
                        declared=self._cache.is_declared,
                    )  # fmt: skip
        utterance.chars += len(command.text)
        if utterance.chars > self._max_text_chars:
            self._output.fail(stream, utterance, "text_too_long", "utterance text over the limit")
            return
        segments = utterance.splitter.feed(command.text)
        if command.final:
            segments += utterance.splitter.flush()
            utterance.final = True
        elif command.release:
            segments += utterance.splitter.release()
        utterance.segments.extend(segments)
        splitter = utterance.splitter
        utterance.private.update(text for text in segments if text in splitter.personal)
        utterance.prefixes.update(text for text in segments if text in splitter.prefixes)
        utterance.wholes.update(splitter.wholes)
        if utterance.keys is not None and self._cache.enabled:
            keys = utterance.keys
            utterance.cached_texts.update(
                text for text in segments if self._cache.contains_local(keys.key(text))
            )

    def cancel(self, stream: Stream, seq: int) -> None:
        """Synthesize no more of utterance ``seq`` than its segment in progress; its
        later text is ignored."""
        for utterance in stream.utterances:
            if utterance.seq == seq:
                utterance.segments.clear()  # the one a worker may hold is its last
                utterance.splitter = stream_splitter(stream.voice.language)
                utterance.final = True
        stream.failed.append(seq)

    def expire_unstarted(self, streams: list[Stream], now: float) -> list[Stream]:
        """Fail with ``queue_timeout`` every new utterance that could have started (its
        stream is ready and has nothing playing) for ``start_timeout_s``; the clock starts
        when it is first seen startable, not when its text came (it may wait behind its
        own stream's earlier prompt). The streams that lost one."""
        failed: list[Stream] = []
        for stream in streams:
            # ready for synthesis, or held back with its next segment cached (its rest
            # could not follow in time yet: Policy.cached_start)
            if not (policy.has_room(stream) and policy.is_new(stream)):
                continue
            head = stream.utterances[0]
            if head.dispatched:  # begun, though nothing of it is heard yet
                continue
            if head.startable_since is None:
                head.startable_since = now
            elif now - head.startable_since > self._start_timeout_s:
                waited = now - head.startable_since
                self._output.fail(
                    stream, head, "queue_timeout",
                    f"not started in {waited:.1f} s: the engine is saturated",
                )  # fmt: skip
                failed.append(stream)
        return failed


def prepare_voice(backends: BackendSet, command: commands.Prepare) -> Message:
    """Extract voice features (on the coordinator thread: the backend's owner)."""
    backend = backends.preparer
    version = backend.version if backend is not None else ""
    started = time.perf_counter()
    try:
        if not isinstance(backend, VoicePreparer):
            raise BackendError(
                "voice_cloning_unsupported", f"backend {backends.name} has no custom voices"
            )
        features = backend.prepare_voice(command.pcm16k, command.language, command.transcript)
        return VoicePrepared(
            request_id=command.request_id,
            features=features,
            backend=backend.name,
            version=version,
            seconds=time.perf_counter() - started,
        )
    except BackendError as exc:
        return VoicePrepareFailed(request_id=command.request_id, code=exc.code, message=exc.message)
    except Exception:
        log.exception("voice preparation failed")
        return VoicePrepareFailed(
            request_id=command.request_id, code="engine_error", message="extraction failed"
        )
