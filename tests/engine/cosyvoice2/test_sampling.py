"""The engine's repetition-aware sampling against upstream's ``ras_sampling``: the same
nucleus and the same draws from the same generator state."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.backends.cosyvoice2 import upstream
from engine.backends.cosyvoice2.model_dir import SamplingParams
from engine.backends.cosyvoice2.streaming import ras_sample

# Log-probabilities whose six most probable tokens sum to just under top_p (0.8) in
# upstream's float32 running sum, while a cumulative sum computed another way puts the
# sixth at 0.8 (a seventh token would join the nucleus: the engine did this before).
AT_THE_THRESHOLD = [
    -9.483941078186035,
    -2.457106590270996,
    -10.429473876953125,
    -9.731201171875,
    -10.122855186462402,
    -1.5560911893844604,
    -9.543499946594238,
    -6.174216270446777,
    -9.006627082824707,
    -4.508294582366943,
    -7.798613548278809,
    -6.591609001159668,
    -2.1304244995117188,
    -8.450345993041992,
    -6.55531644821167,
    -7.300885200500488,
    -11.158050537109375,
    -7.393772602081299,
    -8.7918119430542,
    -3.857156276702881,
    -5.64020299911499,
    -5.926510334014893,
    -1.9241048097610474,
    -2.5668396949768066,
    -8.857593536376953,
    -6.701176166534424,
    -5.149722576141357,
    -2.9076571464538574,
    -2.6746325492858887,
    -4.277792453765869,
    -9.829484939575195,
    -10.067543029785156,
    -6.822281837463379,
    -5.980849266052246,
    -11.390910148620605,
    -10.49008560180664,
    -9.506548881530762,
    -11.501705169677734,
    -1.8214727640151978,
    -5.139456748962402,
]


def kept_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    real = torch.multinomial

    def spy(input: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        sizes.append(input.numel())
        return real(input, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", spy)
    monkeypatch.setattr(torch.Tensor, "multinomial", lambda self, *a, **k: spy(self, *a, **k))
    return sizes


def test_the_nucleus_is_upstream_s_at_the_top_p_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    upstream.require()
    from cosyvoice.utils.common import ras_sampling

    logp = torch.tensor(AT_THE_THRESHOLD, dtype=torch.float32)
    sizes = kept_sizes(monkeypatch)
    torch.manual_seed(5)
    theirs = int(ras_sampling(logp, [], 25, top_p=0.8, top_k=25, win_size=10, tau_r=0.1))
    ours = ras_sample(logp, [], SamplingParams(), torch.Generator().manual_seed(5))
    assert sizes == [6, 6]
    assert ours == theirs


@pytest.mark.parametrize("seed", range(40))
def test_draws_equal_upstream_s_from_the_same_generator_state(seed: int) -> None:
    upstream.require()
    from cosyvoice.utils.common import ras_sampling

    generator = torch.Generator().manual_seed(seed)
    logp = (torch.randn(67, generator=generator) * 2).log_softmax(0)
    recent = torch.randint(0, 67, (12,), generator=generator).tolist()
    recent[-3:] = [int(logp.argmax())] * 3  # the repetition rule has something to find
    torch.manual_seed(seed)
    theirs = [int(ras_sampling(logp, recent[:n], 25)) for n in range(12)]
    ours_generator = torch.Generator().manual_seed(seed)
    ours = [ras_sample(logp, recent[:n], SamplingParams(), ours_generator) for n in range(12)]
    assert ours == theirs
