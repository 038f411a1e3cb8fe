"""The long-output workloads against ARES's Table 2."""

from __future__ import annotations

import numpy as np
import pytest

from pdserve.workload.long_output import (
    CONTEXT_CAP_TOKENS,
    alpaca_long_lengths,
    sharegpt_long_lengths,
)
from pdserve.workload.synthetic import synthetic_workload


def test_sharegpt_long_matches_table_2() -> None:
    inputs, outputs = sharegpt_long_lengths()
    assert outputs.mean() == pytest.approx(7542, rel=0.05)
    assert outputs.std() == pytest.approx(12008, rel=0.05)
    assert np.percentile(outputs, 50) == pytest.approx(1536, rel=0.05)
    assert np.percentile(outputs, 90) == pytest.approx(32670, rel=0.01)
    assert (outputs < 1000).mean() == pytest.approx(0.292, abs=0.02)  # sec. 2.2
    assert (outputs > 30000).mean() == pytest.approx(0.173, abs=0.01)
    assert np.percentile(inputs, 50) == pytest.approx(36, rel=0.2)
    assert np.all(inputs + outputs <= CONTEXT_CAP_TOKENS) and np.all(outputs >= 1)


def test_alpaca_long_matches_table_2() -> None:
    inputs, outputs = alpaca_long_lengths()
    assert outputs.mean() == pytest.approx(8596, rel=0.05)
    assert outputs.std() == pytest.approx(13354, rel=0.05)
    assert np.percentile(outputs, 50) == pytest.approx(987, rel=0.1)
    assert np.percentile(outputs, 90) == pytest.approx(32690, rel=0.01)
    assert inputs.mean() == pytest.approx(11, rel=0.1)
    assert np.percentile(inputs, 90) == pytest.approx(15, abs=1)


def test_selectable_by_name_and_seeded() -> None:
    a = synthetic_workload(50, 0.17, "table:sharegpt-long", seed=3)
    b = synthetic_workload(50, 0.17, "table:sharegpt-long", seed=3)
    assert np.array_equal(a.output_tokens, b.output_tokens)
    assert a.output_tokens.max() > 10_000
