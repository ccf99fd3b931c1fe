"""The scheduler rig's fixture (tests/engine/scheduler/rig.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.scheduler.rig import MakeRig, rigs


@pytest.fixture
def make_rig() -> Iterator[MakeRig]:
    yield from rigs()
