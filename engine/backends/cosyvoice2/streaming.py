"""Many CosyVoice2 streams at once, each with its own state.

Upstream's ``CosyVoice2Model.tts`` runs one request per thread: its LLM decodes one token
per forward pass, its streaming hop lives on the shared model object (so concurrent
requests change each other's chunk sizes, upstream bug 1), sampling draws from the global
generator (bug 4). Here every stream owns:

- its LLM state (:class:`LlmState`): the KV cache, the tokens so far, min/max length, the
  last tokens for repetition-aware sampling, and a ``torch.Generator`` seeded from the
  segment, so a segment's tokens do not depend on what else runs;
- its hop schedule (:class:`HopSchedule`): a short first chunk, then longer ones, always
  ending on the flow model's 25-token chunk boundaries (its attention is chunk-causal, so
  audio cut elsewhere would change when later tokens arrive);
- its vocoder cache (:mod:`~engine.backends.cosyvoice2.token2wav`: the last mel frames
  and source samples, and the 160 ms held back for the cross-fade into the next chunk,
  which is what keeps chunk joins click-free).

:meth:`Decoder.step` advances every given stream by one token in one forward pass of the
Qwen2 body: new streams are prefilled alone (their prompts differ in length), streams
already decoding are batched, their caches slots of one pre-allocated pool
(:mod:`~engine.backends.cosyvoice2.kv_pool`: no cache is copied in or out of a step),
padding masked and each stream's own positions passed.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import torch

from engine.backends.cosyvoice2.kv_pool import KvPool
from engine.backends.cosyvoice2.model_dir import LoadedModel, SamplingParams
from engine.backends.cosyvoice2.voice import VoiceFeatures

MIN_TOKEN_TEXT_RATIO: Final = 2.0  # upstream's min_token_text_ratio
MAX_TOKEN_TEXT_RATIO: Final = 20.0  # upstream's max_token_text_ratio
MAX_EOS_DRAWS: Final = 101  # upstream's sampling_ids: a first draw and max_trials (100) more
ENDOFPROMPT: Final = "<|endofprompt|>"


class StreamError(RuntimeError):
    """A stream cannot go on (sampling could not avoid EOS, for one)."""


@dataclass
class HopSchedule:
    """One stream's chunk sizes, in speech tokens (25 per second of audio).

    The first hop ends on the first chunk boundary at least ``min_first`` tokens after the
    prompt (so 8 to 32 tokens, 0.3-1.3 s, where upstream waits 25 to 49); later hops are
    ``growth`` chunks each, the last value repeating."""

    chunk: int = 25
    min_first: int = 8
    growth: tuple[int, ...] = (1, 2, 4)

    def hops(self, prompt_tokens: int) -> Iterator[int]:
        first = (-prompt_tokens) % self.chunk
        if first < self.min_first:
            first += self.chunk
        yield first
        for multiple in itertools.chain(self.growth, itertools.repeat(self.growth[-1])):
            yield multiple * self.chunk


@dataclass
class LlmState:
    """One stream's autoregressive decoding state."""

    lm_input: torch.Tensor  # the next input embeddings: [1, L, H] (prefill), then [1, 1, H]
    min_len: int
    max_len: int
    generator: torch.Generator
    slot: int | None = None  # its slot in the decoder's KV pool, once prefilled
    length: int = 0  # positions in its cache
    tokens: list[int] = field(default_factory=list)
    steps: int = 0
    done: bool = False


def segment_seed(text: str, voice_key: str) -> int:
    """A stream's sampling seed: the same segment in the same voice gives the same
    speech tokens, whatever else the engine runs."""
    digest = hashlib.blake2b(f"{voice_key}\x00{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def nucleus_size(sorted_probs: npt.NDArray[np.float32], top_p: float, top_k: int) -> int:
    """How many of the most probable tokens upstream's ``nucleus_sampling`` keeps, in its
    arithmetic: a float32 running sum, a token kept while the sum before it is below
    ``top_p`` and fewer than ``top_k`` are kept (a cumulative sum computed another way
    can round differently at the threshold, and pick from another set)."""
    total = np.float32(0.0)
    kept = 0
    for prob in sorted_probs[:top_k]:
        if not total < top_p:
            break
        total = np.float32(total + prob)
        kept += 1
    return kept


def ras_sample(
    logp: torch.Tensor, recent: Sequence[int], params: SamplingParams, generator: torch.Generator
) -> int:
    """Repetition-aware sampling (upstream's ``ras_sampling``) from ``generator``: nucleus
    sampling over the top-p / top-k set; if the pick already fills ``win_size * tau_r`` of
    the last ``win_size`` tokens, a fresh pick from the whole distribution. Given the same
    generator state, the same draws as upstream's (one ``multinomial`` sample takes the
    same path with or without replacement)."""
    probs = logp.float().softmax(dim=0)
    sorted_probs, order = probs.sort(descending=True, stable=True)
    kept = nucleus_size(sorted_probs[: params.top_k].numpy(), params.top_p, params.top_k)
    pick = int(order[torch.multinomial(sorted_probs[:kept], 1, generator=generator)].item())
    window = list(recent[-params.win_size :])
    if window.count(pick) >= params.win_size * params.tau_r:
        pick = int(torch.multinomial(probs, 1, generator=generator).item())
    return pick


class Decoder:
    """Runs LLM decode steps for many streams of one model (see the module docstring)."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self._body = model.llm.llm.model.model  # the Qwen2 body (no text-vocab head)
        names = inspect.signature(self._body.forward).parameters
        self._cache_arg = "cache" if "cache" in names else "past_key_values"
        self._config = model.llm.llm.model.config
        self.eos = model.speech_token_size
        self.max_token_text_ratio = MAX_TOKEN_TEXT_RATIO
        self.pool: KvPool | None = None  # made at the first prefill (its dtype)
        # States given up from outside a step (a failed call's): released by the next step.
        self._discarded: list[LlmState] = []
        self._discard_lock = threading.Lock()

    def start(
        self,
        text_tokens: torch.Tensor,
        voice: VoiceFeatures,
        seed: int,
        *,
        with_prompt_speech: bool = True,
    ) -> LlmState:
        """A stream's state for ``text_tokens`` ([1, T]) spoken like ``voice``; its prompt
        is ``[sos, prompt_text + text, task_id, prompt_speech]`` as in upstream."""
        llm = self.model.llm
        device = self.model.device
        text = torch.cat([voice.prompt_text, text_tokens], dim=1).to(device)
        embedded = llm.llm.model.model.embed_tokens(text)
        sos = llm.llm_embedding.weight[llm.sos_eos].reshape(1, 1, -1)
        task = llm.llm_embedding.weight[llm.task_id].reshape(1, 1, -1)
        if with_prompt_speech and voice.speech_token.shape[1]:
            speech = llm.speech_embedding(voice.speech_token.to(device))
        else:
            speech = embedded.new_zeros(1, 0, embedded.shape[-1])
        text_len = text_tokens.shape[1]
        generator = torch.Generator(device="cpu").manual_seed(seed)
        return LlmState(
            lm_input=torch.cat([sos, embedded, task, speech], dim=1),
            min_len=int(text_len * MIN_TOKEN_TEXT_RATIO),
            max_len=max(1, int(text_len * self.max_token_text_ratio)),
            generator=generator,
        )

    def _forward(
        self, embeds: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> Any:
        if cache is None:
            from transformers import DynamicCache

            cache = DynamicCache(config=self._config)
        return self._body(
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_arg: cache},
        )

    def _pool(self, keys: torch.Tensor) -> KvPool:
        if self.pool is None:
            config = self._config
            self.pool = KvPool(
                int(config.num_hidden_layers),
                int(keys.shape[1]),
                int(keys.shape[3]),
                dtype=keys.dtype,
                device=keys.device,
            )
        return self.pool

    def release(self, state: LlmState) -> None:
        """Free ``state``'s cache (it is done, or cancelled); on the stepping thread."""
        if self.pool is not None:
            self.pool.release(state)

    def discard(self, state: LlmState) -> None:
        """Free ``state``'s cache at the next step: for a thread that does not step (a
        call that failed while another thread may be stepping)."""
        with self._discard_lock:
            self._discarded.append(state)

    def _release_discarded(self) -> None:
        with self._discard_lock:
            discarded, self._discarded = self._discarded, []
        for state in discarded:
            state.done = True
            self.release(state)

    @torch.inference_mode()
    def step(self, states: Sequence[LlmState]) -> None:
        """One token for each state that is not done (see the module docstring)."""
        self._release_discarded()
        hidden: list[tuple[LlmState, torch.Tensor]] = []
        decoding = [s for s in states if not s.done and s.slot is not None]
        for state in (s for s in states if not s.done and s.slot is None):
            length = state.lm_input.shape[1]
            out = self._forward(
                state.lm_input,
                torch.ones(1, length, dtype=torch.long, device=state.lm_input.device),
                torch.arange(length, device=state.lm_input.device)[None, :],
                None,
            )
            layers = [(layer.keys, layer.values) for layer in self._cache_of(out).layers]
            self._pool(layers[0][0]).admit(state, layers)
            hidden.append((state, out.last_hidden_state[0, -1]))
        if decoding:
            hidden.extend(self._decode_batch(decoding))
        for state, h in hidden:
            self._sample(state, h)
            if state.done:
                self.release(state)

    @staticmethod
    def _cache_of(output: Any) -> Any:
        return getattr(output, "cache", None) or output.past_key_values

    def _decode_batch(self, states: Sequence[LlmState]) -> list[tuple[LlmState, torch.Tensor]]:
        """One forward pass for ``states``, their caches views of the pool's buffers."""
        assert self.pool is not None
        ordered = self.pool.to_front(states)
        cache = self.pool.step_cache(ordered)
        device = states[0].lm_input.device
        positions = torch.tensor([[s.length] for s in ordered], device=device)
        embeds = torch.cat([s.lm_input for s in ordered])
        out = self._forward(embeds, cache.attention_mask(), positions, cache)
        for state in ordered:
            state.length += 1
        last = out.last_hidden_state
        return [(state, last[row, -1]) for row, state in enumerate(ordered)]

    def _sample(self, state: LlmState, hidden: torch.Tensor) -> None:
        llm = self.model.llm
        logp = llm.llm_decoder(hidden[None, :]).float().log_softmax(dim=-1)[0].cpu()
        ignore_eos = state.steps < state.min_len
        for _ in range(MAX_EOS_DRAWS):
            token = ras_sample(logp, state.tokens, self.model.sampling, state.generator)
            if not (ignore_eos and token == self.eos):
                break
        else:
            raise StreamError("sampling kept choosing EOS before the minimum length")
        state.steps += 1
        if token == self.eos:
            state.done = True
            return
        if token < self.eos:  # ids above EOS (fill tokens) are skipped, as upstream does
            state.tokens.append(token)
            state.lm_input = llm.speech_embedding.weight[token].reshape(1, 1, -1)
        if state.steps >= state.max_len:
            state.done = True
