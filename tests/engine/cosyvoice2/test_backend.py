"""The cosyvoice2 backend on a tiny model directory in the official layout: the upstream
classes load it and run the real inference code (LLM, flow, HiFT) on the CPU."""

from __future__ import annotations

import shutil
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.backends.base import BackendError, BatchEmit, SynthesisJob, VoiceSettings
from engine.backends.cosyvoice2 import model_dir, upstream
from engine.backends.cosyvoice2.backend import BASE_VOICE, CosyVoice2Backend, CosyVoice2Settings
from engine.backends.cosyvoice2.streaming import HopSchedule, LlmState
from engine.backends.cosyvoice2.voice import VoiceFeatureError, decode, encode
from engine.ipc.env import ConfigError
from tests.engine.cosyvoice2.tiny_model import reference_audio

pytestmark = (
    pytest.mark.slow
)  # the real CosyVoice2 model code at tiny sizes, about a minute in all: not in make check

SAMPLES_PER_TOKEN = 960  # 24 kHz, 25 tokens a second
HELD_BACK = 3840  # upstream's vocoder cross-fade: 160 ms held until the next chunk
# 20 byte tokens with the tiny tokenizer: at least 40 speech tokens (upstream's minimum of
# two per text token), so the first 25-token chunk always comes before the final one.
TEXT = "Hello there, caller."


def reference_pcm(seconds: float = 3.0, pitch_hz: float = 140.0) -> bytes:
    audio = reference_audio(seconds, pitch_hz=pitch_hz).numpy()
    return (audio * 32767).astype("<i2").tobytes()


def run_batch(
    backend: CosyVoice2Backend, jobs: list[SynthesisJob], stop_after: dict[int, int] | None = None
) -> dict[int, list[np.ndarray]]:
    chunks: dict[int, list[np.ndarray]] = defaultdict(list)

    def emit(index: int, pcm: np.ndarray) -> bool:
        if len(pcm):  # empty: the backend asking whether the stream is still wanted
            chunks[index].append(pcm)
        return stop_after is None or len(chunks[index]) < stop_after.get(index, 10**9)

    backend.synthesize_batch(jobs, emit)
    return chunks


def rms_dbfs(pcm: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean((pcm.astype(np.float64) / 32768) ** 2)) + 1e-12))


def test_layout_is_checked_and_only_the_model_sections_are_built(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    with pytest.raises(model_dir.ModelDirError, match=r"missing .*llm\.pt"):
        shutil.copy(tiny_model_dir / "cosyvoice2.yaml", tmp_path / "cosyvoice2.yaml")
        model_dir.check_layout(tmp_path)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "cosyvoice.yaml").write_text("x: 1\n")
    with pytest.raises(model_dir.ModelDirError, match="CosyVoice 1"):
        model_dir.check_layout(legacy)
    kept = model_dir.inference_yaml((tiny_model_dir / "cosyvoice2.yaml").read_text())
    assert "llm: !new:cosyvoice.llm.llm.Qwen2LM" in kept
    assert "hift: !new:" in kept and "flow: !new:" in kept
    top_level = {line.split(":")[0] for line in kept.splitlines() if line and not line[0].isspace()}
    assert {"llm", "flow", "hift", "sample_rate"} <= top_level
    assert not top_level & {"hifigan", "get_tokenizer", "train_conf", "__set_seed1"}
    assert "MultipleDiscriminator" not in kept
    assert "sample_rate: 24000" in kept


def test_the_version_follows_the_model_files(tmp_path: Path, tiny_model_dir: Path) -> None:
    copy = tmp_path / "model"
    copy.mkdir()
    for entry in tiny_model_dir.iterdir():
        (copy / entry.name).symlink_to(entry)
    before = model_dir.model_version(copy)
    assert before == model_dir.model_version(tiny_model_dir)
    (copy / "campplus.onnx").unlink()
    data = bytearray((tiny_model_dir / "campplus.onnx").read_bytes())
    data[-1] ^= 0xFF
    (copy / "campplus.onnx").write_bytes(bytes(data))
    assert model_dir.model_version(copy) != before


def test_stand_ins_lend_names_but_refuse_use(tiny_model_dir: Path) -> None:
    upstream.require()
    import torchaudio  # the stand-in: the real one does not load against this torch

    if not isinstance(torchaudio, upstream._StandInModule):
        pytest.skip("a working torchaudio is installed; no stand-in registered")
    with pytest.raises(upstream.StandInTouched):
        torchaudio.load("x.wav")
    from torchaudio.compliance import kaldi

    with pytest.raises(upstream.StandInTouched):
        kaldi.fbank(torch.zeros(1, 400))


def test_missing_packages_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = upstream._importable
    monkeypatch.setattr(upstream, "_importable", lambda name: name != "diffusers" and real(name))
    with pytest.raises(upstream.UpstreamUnavailable, match="diffusers"):
        upstream.require()


def test_hops_start_short_end_on_chunk_boundaries_and_grow() -> None:
    schedule = HopSchedule(chunk=25, min_first=8)
    hops = schedule.hops(prompt_tokens=60)
    taken = [next(hops) for _ in range(5)]
    assert taken == [15, 25, 50, 100, 100]
    assert (60 + taken[0]) % 25 == 0
    short = HopSchedule(chunk=25, min_first=8).hops(prompt_tokens=70)
    assert next(short) == 30  # 5 would be under min_first: one chunk more


def test_speech_comes_in_chunks_of_the_stream_s_hops(cosyvoice2: CosyVoice2Backend) -> None:
    voice = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE))
    chunks = run_batch(cosyvoice2, [SynthesisJob(TEXT, voice, leading=True)])[0]
    sizes = [len(c) for c in chunks]
    # No reference: the first hop is one chunk of 25 tokens, then 25, 50, 100, ...
    assert sizes[0] == 25 * SAMPLES_PER_TOKEN - HELD_BACK
    if len(sizes) > 2:
        assert sizes[1] == 25 * SAMPLES_PER_TOKEN
    audio = np.concatenate(chunks)
    assert len(audio) % SAMPLES_PER_TOKEN == 0
    assert -40 < rms_dbfs(audio) < -3


def test_chunk_joins_are_click_free(cosyvoice2: CosyVoice2Backend) -> None:
    voice = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE))
    chunks = run_batch(cosyvoice2, [SynthesisJob("Thank you for calling.", voice)])[0]
    assert len(chunks) >= 3
    audio = np.concatenate(chunks).astype(np.float64)
    steps = np.abs(np.diff(audio))
    joins = np.cumsum([len(c) for c in chunks[:-1]])
    typical = np.percentile(steps, 99.9)
    for join in joins:
        assert steps[join - 1] <= typical, f"a jump of {steps[join - 1]:.0f} at a chunk join"


def decode_all(backend: CosyVoice2Backend, states: list[LlmState]) -> list[list[int]]:
    while not all(state.done for state in states):
        backend.decoder.step(states)
    return [state.tokens for state in states]


def test_a_batch_gives_each_stream_the_tokens_it_gets_alone(cosyvoice2: CosyVoice2Backend) -> None:
    base = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE)).features
    blob = cosyvoice2.prepare_voice(reference_pcm(2.0), None, "This is my voice.")
    cloned = decode(blob, cosyvoice2.version)
    work = [
        (TEXT, base, 1),
        ("Press one.", cloned, 2),
        ("Goodbye!", base, 3),
        ("Thank you.", cloned, 4),
    ]

    def states() -> list[LlmState]:
        return [
            cosyvoice2.decoder.start(cosyvoice2.front_end.text_tokens(text), voice, seed)
            for text, voice, seed in work
        ]

    together = decode_all(cosyvoice2, states())
    alone = [decode_all(cosyvoice2, [state])[0] for state in states()]
    assert together == alone
    assert len({len(tokens) for tokens in together}) > 1  # ragged: streams end apart
    # Through the backend: a batch's streams get the chunks they get alone (the
    # vocoder's excitation noise comes from torch's global generator, as upstream's
    # does, so samples differ by that noise; sizes follow the tokens exactly).
    voice = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE))
    jobs = [SynthesisJob(TEXT, voice), SynthesisJob("Goodbye!", voice)]
    batch = run_batch(cosyvoice2, jobs)
    for index, job in enumerate(jobs):
        assert [len(c) for c in batch[index]] == [len(c) for c in run_batch(cosyvoice2, [job])[0]]


def test_one_stream_s_hops_do_not_change_another_s(cosyvoice2: CosyVoice2Backend) -> None:
    base = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE))
    blob = cosyvoice2.prepare_voice(reference_pcm(2.2), None, "Another voice.")
    cloned = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE, profile=blob))
    prompt_tokens = cloned.features.speech_token.shape[1]
    assert prompt_tokens % 25 != 0
    chunks = run_batch(cosyvoice2, [SynthesisJob(TEXT, base), SynthesisJob(TEXT, cloned)])
    first_hop = next(HopSchedule().hops(prompt_tokens))
    assert len(chunks[0][0]) == 25 * SAMPLES_PER_TOKEN - HELD_BACK
    assert len(chunks[1][0]) == first_hop * SAMPLES_PER_TOKEN - HELD_BACK


def test_a_cancelled_stream_stops_at_once_and_frees_its_caches(
    cosyvoice2: CosyVoice2Backend,
) -> None:
    voice = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE))
    jobs = [SynthesisJob("Please hold the line.", voice), SynthesisJob(TEXT, voice)]
    alone = run_batch(cosyvoice2, [jobs[1]])[0]
    chunks = run_batch(cosyvoice2, jobs, stop_after={0: 1})
    assert len(chunks[0]) == 1
    assert [len(c) for c in chunks[1]] == [len(c) for c in alone]
    assert cosyvoice2.vocoder.open_streams() == 0


def test_a_registered_voice_is_prepared_once_and_reused(cosyvoice2: CosyVoice2Backend) -> None:
    with pytest.raises(BackendError) as missing:
        cosyvoice2.prepare_voice(reference_pcm(), None, None)
    assert missing.value.code == "transcript_required"
    with pytest.raises(BackendError) as short:
        cosyvoice2.prepare_voice(reference_pcm(0.2), None, "Hi.")
    assert short.value.code == "invalid_audio"
    blob = cosyvoice2.prepare_voice(reference_pcm(), None, "Hello, this is my voice.")
    features = decode(blob, cosyvoice2.version)
    assert features.speech_token.shape[1] == 75  # 3 s at 25 Hz
    assert features.speech_feat.shape == (1, 150, 80)
    assert features.embedding.shape == (1, 192)
    assert (
        decode(encode(features), cosyvoice2.version).prompt_text.tolist()
        == features.prompt_text.tolist()
    )
    with pytest.raises(VoiceFeatureError, match="made by"):
        decode(blob, "cosyvoice2-another-model")
    with pytest.raises(BackendError) as stale:
        cosyvoice2.resolve_voice(
            VoiceSettings(
                BASE_VOICE, profile=blob.replace(cosyvoice2.version.encode(), b"cosyvoice2-old")
            )
        )
    assert stale.value.code == "invalid_voice_profile"
    voice = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE, profile=blob))
    chunks = run_batch(cosyvoice2, [SynthesisJob(TEXT, voice)])[0]
    assert len(chunks[0]) == 25 * SAMPLES_PER_TOKEN - HELD_BACK  # 75 prompt tokens: one chunk
    assert rms_dbfs(np.concatenate(chunks)) > -40


def test_unknown_voices_and_speeds_are_refused(cosyvoice2: CosyVoice2Backend) -> None:
    with pytest.raises(BackendError) as unknown:
        cosyvoice2.resolve_voice(VoiceSettings("en-us"))
    assert unknown.value.code == "unknown_voice"
    with pytest.raises(BackendError) as speed:
        cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE, speed=1.5))
    assert speed.value.code == "invalid_speed"
    assert next(v.id for v in cosyvoice2.voices()) == BASE_VOICE
    assert all(v.backend == "cosyvoice2" and v.language == "mul" for v in cosyvoice2.voices())


def test_a_segment_handed_over_later_joins_the_running_streams(
    cosyvoice2: CosyVoice2Backend,
) -> None:
    voice = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE))
    events: list[tuple[str, float]] = []

    def recorder(kind: str) -> BatchEmit:
        def emit(_index: int, pcm: np.ndarray) -> bool:
            if len(pcm):
                events.append((kind, time.monotonic()))
            return True

        return emit

    long_running = threading.Thread(
        target=cosyvoice2.synthesize_batch,
        args=(
            [SynthesisJob("Thank you for calling the billing department.", voice)],
            recorder("long"),
        ),
    )
    long_running.start()
    while not events:
        time.sleep(0.005)
    cosyvoice2.synthesize_batch(
        [SynthesisJob("Press one.", voice)],
        recorder("short"),
    )
    long_running.join(120)
    kinds = [kind for kind, _ in events]
    # The short segment ran to its end while the long one was still producing audio.
    assert "short" in kinds and kinds[-1] == "long"
    assert cosyvoice2._loop.widest >= 2


def test_an_instruction_replaces_the_transcript_and_keeps_the_voice(
    cosyvoice2: CosyVoice2Backend,
) -> None:
    blob = cosyvoice2.prepare_voice(reference_pcm(2.0), None, "This is my voice.")
    plain = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE, profile=blob))
    styled = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE, profile=blob, instruct="开心"))
    assert plain.instruct is None and styled.instruct == "开心"
    captured: dict[str, Any] = {}
    real_start = cosyvoice2.decoder.start

    def start(text, voice, seed, *, with_prompt_speech=True):
        state = real_start(text, voice, seed, with_prompt_speech=with_prompt_speech)
        captured["prompt_text" if with_prompt_speech else "instruct"] = state.lm_input.shape[1]
        captured[f"voice-{with_prompt_speech}"] = voice
        return state

    cosyvoice2.decoder.start = start  # type: ignore[method-assign]
    try:
        chunks = {
            name: run_batch(cosyvoice2, [SynthesisJob(TEXT, voice)])[0]
            for name, voice in (("plain", plain), ("styled", styled))
        }
    finally:
        del cosyvoice2.decoder.start
    instructed = captured["voice-False"]
    # instruct2: the LLM's prompt is the instruction (+ <|endofprompt|>), without the
    # reference's speech; the flow model keeps the reference's features.
    expected = cosyvoice2.front_end.text_tokens("开心<|endofprompt|>")
    assert instructed.prompt_text.tolist() == expected.tolist()
    assert torch.equal(instructed.speech_feat, plain.features.speech_feat)
    assert torch.equal(instructed.embedding, plain.features.embedding)
    assert captured["instruct"] < captured["prompt_text"]  # no reference speech tokens
    assert all(rms_dbfs(np.concatenate(c)) > -40 for c in chunks.values())
    with pytest.raises(BackendError) as long:
        cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE, instruct="x" * 201))
    assert long.value.code == "text_too_long"


def test_a_gpu_out_of_memory_fails_the_step_s_streams_and_the_engine_goes_on(
    cosyvoice2: CosyVoice2Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    voice = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE))
    real_step = cosyvoice2.decoder.step
    steps = {"n": 0}

    def step(states: list[LlmState]) -> None:
        steps["n"] += 1
        if steps["n"] == 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        real_step(states)

    monkeypatch.setattr(cosyvoice2.decoder, "step", step)
    with pytest.raises(BackendError) as oom:
        run_batch(cosyvoice2, [SynthesisJob(TEXT, voice), SynthesisJob("Goodbye!", voice)])
    assert oom.value.code == "cuda_oom"
    assert cosyvoice2.vocoder.open_streams() == 0
    assert cosyvoice2._loop.active_streams() == 0
    chunks = run_batch(cosyvoice2, [SynthesisJob(TEXT, voice)])[0]  # the next batch runs
    assert chunks and sum(len(c) for c in chunks) > 0
    # The failed streams' KV slots were given back (at the next step), none is held.
    assert cosyvoice2.decoder.pool is not None and cosyvoice2.decoder.pool.used == 0
    assert cosyvoice2.gpu_memory() == (0, 0) and not cosyvoice2.on_gpu  # CPU: RSS counts


def test_a_cancel_stops_decoding_at_the_next_step_not_the_next_chunk(
    cosyvoice2: CosyVoice2Backend,
) -> None:
    voice = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE))
    steps_before = cosyvoice2._loop.steps
    polls = {"n": 0}

    def emit(_index: int, pcm: np.ndarray) -> bool:
        polls["n"] += 1
        return polls["n"] < 3  # wanted for two steps, then cancelled (no audio yet)

    cosyvoice2.synthesize_batch([SynthesisJob("Thank you for calling us today.", voice)], emit)
    assert cosyvoice2._loop.steps - steps_before <= 3  # not the 28 of a first chunk
    assert cosyvoice2.vocoder.open_streams() == 0


def test_streams_opened_from_many_threads_at_once_tokenize_alike(
    cosyvoice2: CosyVoice2Backend,
) -> None:
    texts = [f"Caller number {i}, please hold." for i in range(16)]
    expected = [cosyvoice2.front_end.text_tokens(t).tolist() for t in texts]
    results: list[list[list[int]]] = [[] for _ in texts]
    barrier = threading.Barrier(len(texts))

    def tokenize(i: int) -> None:
        barrier.wait()
        for _ in range(50):
            results[i] = cosyvoice2.front_end.text_tokens(texts[i]).tolist()

    threads = [threading.Thread(target=tokenize, args=(i,)) for i in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == expected


def test_settings_are_checked_with_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="COSYVOICE2_MODEL_DIR"):
        CosyVoice2Settings.from_env({"ENGINE_BACKEND": "cosyvoice2"})
    settings = CosyVoice2Settings.from_env(
        {"COSYVOICE2_MODEL_DIR": str(tmp_path), "ENGINE_DEVICE": "cpu", "ENGINE_MAX_BATCH": "64"}
    )
    assert (
        settings.max_streams == 64
        and settings.torch_dtype(settings.torch_device()) == torch.float32
    )
    assert CosyVoice2Settings.from_env({"COSYVOICE2_MODEL_DIR": str(tmp_path)}).max_streams == 16
    with pytest.raises(ConfigError, match="ENGINE_DEVICE"):
        CosyVoice2Settings(model_dir=tmp_path, device="gpu0").torch_device()
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            CosyVoice2Settings(model_dir=tmp_path, device="cuda:1").torch_device()
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        CosyVoice2Settings(model_dir=tmp_path, dtype="float16").torch_dtype(torch.device("cpu"))
    with pytest.raises(ConfigError, match="one of"):
        CosyVoice2Settings(model_dir=tmp_path, dtype="int8").torch_dtype(torch.device("cpu"))
    expected = (
        upstream.UpstreamUnavailable if upstream.missing_packages() else model_dir.ModelDirError
    )
    with pytest.raises(expected, match="missing"):  # the packages, or the model's files
        CosyVoice2Backend(CosyVoice2Settings(model_dir=tmp_path))
