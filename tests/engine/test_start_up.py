"""The start-up is frozen: what `start_session` and the `--dtype auto` check give is never
changed after it is made; a new budget or a settled dtype is a new object."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from bulkembed.batching.packing import BatchPolicy, BudgetSource
from bulkembed.batching.tokenize import TokenizedChunk
from bulkembed.config import DType, RunConfig
from bulkembed.engine import precision
from bulkembed.engine.session import DeviceSession, Settled, Start, Unsettled, start_session
from bulkembed.models import devices
from bulkembed.models.model_spec import resolve_model
from bulkembed.reporting.progress import QuietReporter
from bulkembed.sources import Chunk


@pytest.mark.parametrize("kind", [BatchPolicy, Start, DeviceSession, Unsettled, Settled])
def test_every_start_up_type_is_a_frozen_dataclass(kind):
    assert dataclasses.is_dataclass(kind)
    assert kind.__dataclass_params__.frozen


def test_a_probe_gives_a_new_policy_that_only_lowers_one_probed_before():
    given = BatchPolicy(16384, BudgetSource.GIVEN)
    assert given.probed(None) is given
    probed = given.probed(40000)
    assert (probed.tokens, probed.source) == (40000, BudgetSource.PROBED)
    assert given.tokens == 16384
    assert given.probed(40000).probed(50000).tokens == 40000
    assert probed.probed(50000, lower_only=False).tokens == 50000


def test_settling_gives_a_new_session_and_changes_neither_start(tiny_st, monkeypatch):
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    monkeypatch.setattr(precision, "PARITY_THRESHOLD", 0.9)
    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    unsettled = start_session(spec, ["cpu"], DType.AUTO, None, QuietReporter())
    assert isinstance(unsettled, Unsettled)
    fields = dataclasses.asdict(unsettled.policy), unsettled.dtype, unsettled.recorded
    with pytest.raises(dataclasses.FrozenInstanceError):
        unsettled.policy = BatchPolicy(1, BudgetSource.GIVEN)  # type: ignore[misc]
    chunk = Chunk(0, 0, pa.array(["a", "b"]), pa.array(["x", "y"]), True)
    tokens, lengths = np.arange(1, 7, dtype=np.int32), np.array([3, 3])
    settled = unsettled.settle([TokenizedChunk(chunk, tokens, lengths, np.zeros(2, bool))])
    assert settled is not None and settled.session.dtype == "bfloat16"
    assert (dataclasses.asdict(unsettled.policy), unsettled.dtype, unsettled.recorded) == fields
    with pytest.raises(dataclasses.FrozenInstanceError):
        settled.session.dtype = "float32"  # type: ignore[misc]
    float32 = start_session(spec, ["cpu"], DType.FLOAT32, None, QuietReporter())
    assert isinstance(float32, DeviceSession) and float32.dtype == "float32"
    assert float32.policy == BatchPolicy(spec.budget, BudgetSource.RECIPE)
