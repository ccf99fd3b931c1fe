"""A CosyVoice2 model directory in the official layout, with tiny dimensions and random
weights, for the tests (no weights can be downloaded here).

Everything the official ``CosyVoice2-0.5B`` directory holds is written, by the same
classes:

- ``cosyvoice2.yaml``: the official structure (``llm`` a ``Qwen2LM`` around a
  ``Qwen2Encoder``, ``flow`` a ``CausalMaskedDiffWithXvec`` with an
  ``UpsampleConformerEncoder`` and a ``CausalConditionalCFM`` over a
  ``CausalConditionalDecoder``, ``hift`` a ``HiFTGenerator``, ras sampling, and the
  training sections the official file carries, which the loader must skip), with tiny
  widths and depths;
- ``llm.pt``, ``flow.pt``, ``hift.pt``: state dicts of those modules, seeded;
- ``CosyVoice-BlankEN/``: a Qwen2 configuration, its weights and the tokenizer files in
  the official layout (``vocab.json``, ``merges.txt``, ``tokenizer_config.json`` naming
  ``Qwen2Tokenizer``, Qwen's special tokens; 256 byte symbols and no merges);
- ``campplus.onnx`` and ``speech_tokenizer_v2.onnx``: exported from tiny torch modules
  with the official input and output shapes ([1, frames, 80] fbank to a [1, 192]
  embedding; [1, 128, frames] log-mel and its length to [1, frames / 4] speech tokens);
- ``spk2info.pt``: one built-in speaker (``tiny``), made by the backend's own front end
  from a synthetic reference, as ``add_zero_shot_spk`` + ``save_spkinfo`` would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import torch


@dataclass(frozen=True)
class ModelDims:
    """The sizes the yaml, the Qwen2 body and the front-end models are written with."""

    name: str
    speech_tokens: int
    hidden: int  # the Qwen2 body's width (llm_input_size, llm_output_size)
    qwen_layers: int
    qwen_heads: int
    qwen_kv_heads: int
    qwen_ffn: int
    text_vocab: int
    encoder_heads: int
    encoder_ffn: int
    encoder_blocks: int
    estimator_channels: int
    estimator_head_dim: int
    estimator_blocks: int
    estimator_mid_blocks: int
    estimator_heads: int
    hift_channels: int
    hift_resblock_kernels: tuple[int, ...]


# Tests: small enough to run on the CPU in seconds. 256 byte symbols, <|endoftext|> and
# the tokenizer's specials fit in the text vocabulary.
TINY: Final = ModelDims("tiny", 64, 32, 2, 2, 1, 64, 320, 2, 64, 1, 32, 16, 1, 1, 2, 16, (3,))
# CosyVoice2-0.5B's published sizes (its cosyvoice2.yaml; the Qwen2.5-0.5B body): for the
# capacity benchmark's cost model (random weights: the cost of the real model, not speech).
OFFICIAL: Final = ModelDims(
    "official", 6561, 896, 24, 14, 2, 4864, 151936, 8, 2048, 6, 256, 64, 4, 12, 8, 512, (3, 7, 11)
)


def model_yaml(d: ModelDims) -> str:
    """cosyvoice2.yaml in the official structure with the sizes ``d``."""
    resblocks = ", ".join(str(k) for k in d.hift_resblock_kernels)
    dilations = ", ".join("[1, 3, 5]" for _ in d.hift_resblock_kernels)
    return f"""# CosyVoice2 configuration, official structure, {d.name} dimensions.
__set_seed1: !apply:random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]

sample_rate: 24000
llm_input_size: {d.hidden}
llm_output_size: {d.hidden}
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2

llm: !new:cosyvoice.llm.llm.Qwen2LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: {d.speech_tokens}
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    input_size: 512
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {d.speech_tokens}
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
        output_size: 512  # the upstream encoder's lookahead and upsampling layers fix 512
        attention_heads: {d.encoder_heads}
        linear_units: {d.encoder_ffn}
        num_blocks: {d.encoder_blocks}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: 'linear'
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        input_size: 512
        use_cnn_module: False
        macaron_style: False
        static_chunk_size: !ref <token_frame_rate>
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: 320
            out_channels: 80
            channels: [{d.estimator_channels}]
            dropout: 0.0
            attention_head_dim: {d.estimator_head_dim}
            n_blocks: {d.estimator_blocks}
            num_mid_blocks: {d.estimator_mid_blocks}
            num_heads: {d.estimator_heads}
            act_fn: 'gelu'
            static_chunk_size: !ref <token_frame_rate> * <token_mel_ratio>
            num_decoding_left_chunks: -1

hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    in_channels: 80
    base_channels: {d.hift_channels}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [{resblocks}]
    resblock_dilation_sizes: [{dilations}]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: {d.hift_channels}

# The official file goes on with training sections; a loader must not build them (the
# discriminator needs torchaudio).
hifigan: !new:cosyvoice.hifigan.hifigan.HiFiGan
    generator: !ref <hift>
    discriminator: !new:cosyvoice.hifigan.discriminator.MultipleDiscriminator
        mpd: !new:matcha.hifigan.models.MultiPeriodDiscriminator
        mrd: !new:cosyvoice.hifigan.discriminator.MultiResolutionDiscriminator
get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>
    skip_special_tokens: True
train_conf:
    optim: adam
    max_epoch: 200
"""


class TinySpeechTokenizer(torch.nn.Module):
    """[1, 128, frames] log-mel + [1] length -> [1, frames // 4] token ids."""

    def __init__(self, speech_tokens: int) -> None:
        super().__init__()
        self.project = torch.nn.Conv1d(128, speech_tokens, kernel_size=4, stride=4)

    def forward(self, feats: torch.Tensor, feats_length: torch.Tensor) -> torch.Tensor:
        frames = torch.arange(feats.shape[2], device=feats.device)
        valid = (frames[None, :] < feats_length[:, None]).to(feats.dtype)
        tokens: torch.Tensor = self.project(feats * valid[:, None, :]).argmax(dim=1)
        return tokens.to(torch.int32)


class TinyCampplus(torch.nn.Module):
    """[1, frames, 80] fbank -> [1, 192] speaker embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.project = torch.nn.Linear(160, 192)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        pooled = torch.cat([feats.mean(dim=1), feats.std(dim=1)], dim=-1)
        embedding: torch.Tensor = self.project(pooled)
        return embedding


# Qwen2's own special tokens, after the vocabulary, as in Qwen2.5-0.5B's tokenizer files
# (CosyVoice's QwenTokenizer adds its own, <|endofprompt|> and the rest, when it loads).
QWEN_SPECIALS: Final = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _write_tokenizer(directory: Path) -> None:
    """The tokenizer files in the layout CosyVoice-BlankEN ships (Qwen2.5's:
    ``vocab.json``, ``merges.txt``, ``tokenizer_config.json`` naming ``Qwen2Tokenizer``,
    with Qwen's pre-tokenizer and special tokens; no ``tokenizer.json``), its vocabulary
    the 256 byte symbols and no merges, so every byte is a token."""
    from tokenizers import pre_tokenizers

    vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (directory / "merges.txt").write_text("#version: 0.2\n")
    added = {
        str(len(vocab) + i): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, token in enumerate(QWEN_SPECIALS)
    }
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": list(QWEN_SPECIALS[1:]),
        "bos_token": None,
        "chat_template": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def _write_blank_en(directory: Path, d: ModelDims) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    directory.mkdir(parents=True)
    _write_tokenizer(directory)
    config = Qwen2Config(
        vocab_size=d.text_vocab,
        hidden_size=d.hidden,
        intermediate_size=d.qwen_ffn,
        num_hidden_layers=d.qwen_layers,
        num_attention_heads=d.qwen_heads,
        num_key_value_heads=d.qwen_kv_heads,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(directory)


def _export(
    module: torch.nn.Module, args: tuple[torch.Tensor, ...], path: Path, **names: object
) -> None:
    torch.onnx.export(module.eval(), args, str(path), dynamo=False, **names)  # type: ignore[arg-type]


def reference_audio(
    seconds: float = 3.0, rate: int = 16000, pitch_hz: float = 140.0
) -> torch.Tensor:
    """A voiced-sounding synthetic reference: a glottal-like pulse train through two
    formant-ish resonances, with a slow pitch glide and syllable-rate amplitude."""
    t = torch.arange(int(seconds * rate), dtype=torch.float64) / rate
    f0 = pitch_hz * (1.0 + 0.1 * torch.sin(2 * torch.pi * 0.7 * t))
    phase = 2 * torch.pi * torch.cumsum(f0, 0) / rate
    voice = sum(torch.sin(k * phase) / k for k in range(1, 12))
    envelope = 0.55 + 0.45 * torch.sin(2 * torch.pi * 4.0 * t).abs()
    return (0.25 * voice * envelope / 2.0).float()


SPEAKER: Final = "tiny"
SPEAKER_TRANSCRIPT: Final = "Thank you for calling."


def _write_spk2info(directory: Path) -> None:
    """``spk2info.pt`` with one speaker, as ``add_zero_shot_spk`` + ``save_spkinfo`` store
    one (the frontend dict without its text), its features made by the backend's front
    end from a synthetic reference (upstream's needs whisper and torchaudio)."""
    from cosyvoice.tokenizer.tokenizer import QwenTokenizer

    from engine.backends.cosyvoice2.voice import FrontEnd

    front_end = FrontEnd(directory, QwenTokenizer(str(directory / "CosyVoice-BlankEN")), "")
    pcm = (reference_audio(2.6, pitch_hz=190.0).numpy() * 32767).astype("<i2")
    voice = front_end.prepare(pcm, SPEAKER_TRANSCRIPT)
    torch.save({SPEAKER: voice.as_spk2info()}, directory / "spk2info.pt")


def write_tiny_model(directory: Path) -> Path:
    """Write the tiny model directory (created) and return it."""
    return write_model(directory, TINY)


def write_model(directory: Path, d: ModelDims) -> Path:
    """Write a model directory with the sizes ``d`` (created) and return it."""
    from engine.backends.cosyvoice2 import upstream

    upstream.require()
    from hyperpyyaml import load_hyperpyyaml

    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(1986)
    blank_en = directory / "CosyVoice-BlankEN"
    _write_blank_en(blank_en, d)
    text = model_yaml(d)
    (directory / "cosyvoice2.yaml").write_text(text)
    sections = text.split("\n# The official file goes on", 1)[0]
    built = load_hyperpyyaml(sections, overrides={"qwen_pretrain_path": str(blank_en)})
    for name in ("llm", "flow", "hift"):
        module: torch.nn.Module = built[name]
        # Random weights, but not so small that the audio is silence.
        with torch.no_grad():
            for parameter in module.parameters():
                if parameter.dim() > 1:
                    parameter.normal_(0.0, 0.3 / parameter.shape[1] ** 0.5)
        torch.save(module.state_dict(), directory / f"{name}.pt")
    feats = torch.randn(1, 128, 40)
    _export(
        TinySpeechTokenizer(d.speech_tokens),
        (feats, torch.tensor([40], dtype=torch.int32)),
        directory / "speech_tokenizer_v2.onnx",
        input_names=["feats", "feats_length"],
        output_names=["indices"],
        dynamic_axes={"feats": {2: "frames"}, "indices": {1: "tokens"}},
    )
    _export(
        TinyCampplus(),
        (torch.randn(1, 50, 80),),
        directory / "campplus.onnx",
        input_names=["input"],
        output_names=["embedding"],
        dynamic_axes={"input": {1: "frames"}},
    )
    _write_spk2info(directory)
    (directory / "README.random-weights.json").write_text(
        json.dumps({"dims": d.name, "random_weights": True, "speech_tokens": d.speech_tokens})
    )
    return directory
