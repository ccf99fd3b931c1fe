"""The backend table (engine/backends/table.py) and the capability records the scheduler,
the routing and the gateway read (engine/backends/base.py ``capabilities_of``)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import pytest

from engine.backends.base import (
    BatchEmit,
    BatchSynthesizer,
    SynthesisJob,
    capabilities_of,
    create_backend,
)
from engine.backends.espeak import EspeakBackend
from engine.backends.synthetic import SyntheticBackend
from engine.backends.table import BACKENDS, backend_names
from engine.ipc.schema import Capabilities, FrameDecoder, Welcome, encode


def test_every_row_names_a_factory_in_its_own_backend_module() -> None:
    assert backend_names() == sorted(BACKENDS)
    assert {"cosyvoice2", "espeak", "piper", "synthetic"} <= set(BACKENDS)
    for name, target in BACKENDS.items():
        module, _, factory = target.partition(":")
        assert module.startswith(f"engine.backends.{name}")
        assert callable(getattr(importlib.import_module(module), factory))


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="known: cosyvoice2, espeak, kokoro, piper, synthetic"):
        create_backend("festival")


def test_backends_declare_what_they_can_do() -> None:
    from engine.backends.piper import PiperBackend

    assert PiperBackend.capabilities == Capabilities(
        independent_calls=True, batch=True, word_timings=True
    )
    assert EspeakBackend.capabilities == Capabilities(word_timings=True, cloning=True)
    synthetic = create_backend("synthetic")
    assert capabilities_of(synthetic) == Capabilities(cloning=True)


class _Batches(SyntheticBackend):
    independent_calls = True
    follows_instructions = True
    max_batch = 2
    threads = 1

    def batch_key(self, voice: object) -> object:
        return "one"

    def synthesize_batch(self, jobs: Sequence[SynthesisJob], emit: BatchEmit) -> None:
        raise AssertionError("not run")


class _Undeclared:
    """A double written to the protocols alone (no ``capabilities``)."""

    max_batch = 1
    threads = 1

    def batch_key(self, voice: object) -> object:
        return "one"

    def synthesize_batch(self, jobs: Sequence[SynthesisJob], emit: BatchEmit) -> None:
        raise AssertionError("not run")


def test_test_doubles_get_the_record_their_shape_shows() -> None:
    assert capabilities_of(_Batches()) == Capabilities(
        independent_calls=True, batch=True, cloning=True, instruct=True
    )
    undeclared = _Undeclared()
    assert isinstance(undeclared, BatchSynthesizer)
    assert capabilities_of(undeclared) == Capabilities(batch=True)  # type: ignore[arg-type]


def test_the_records_travel_to_the_gateway_in_welcome() -> None:
    welcome = Welcome(
        protocol_version=1, engine_pid=1, backend="piper,espeak", shm_name="x",
        shm_directory="/dev/shm", slots=1, out_ring_bytes=1, in_ring_bytes=1,
        native_sample_rate=22050, max_text_chars=5000, voices=(),
        capabilities={"piper": Capabilities(independent_calls=True, batch=True)},
    )  # fmt: skip
    [decoded] = FrameDecoder("from_engine").feed(encode(welcome))
    assert isinstance(decoded, Welcome) and decoded == welcome
    assert decoded.capabilities["piper"].independent_calls
    assert decoded.capabilities["piper"].device == "cpu"
