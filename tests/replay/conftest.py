"""Fixtures for replays: a real trace with every collective kind."""

from __future__ import annotations

import pytest

from emu.capture import import_kineto
from emu.traces import Trace
from tests.conftest import GLOO_COLLECTIVES


@pytest.fixture(scope="session")
def collectives_trace() -> Trace:
    return import_kineto([GLOO_COLLECTIVES])
