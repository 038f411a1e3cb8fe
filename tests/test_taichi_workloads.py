"""The ShareGPT length tables (TaiChi's chatbot workload) and the long-input arXiv stand-in."""

from __future__ import annotations

import numpy as np

from pdserve.workload.synthetic import synthetic_workload
from pdserve.workload.traces import load_length_table


def test_sharegpt_tables_are_filtered_at_2048_tokens():
    for name in ("sharegpt", "sharegpt-first"):
        inputs, outputs = load_length_table(name)
        assert (inputs + outputs).max() <= 2048 and inputs.min() > 0 and outputs.min() > 0
    rounds_in, _ = load_length_table("sharegpt")
    first_in, _ = load_length_table("sharegpt-first")
    assert len(rounds_in) > 3 * len(first_in) > 30000  # every round vs first rounds
    assert rounds_in.mean() > 3 * first_in.mean()  # prompts carry the conversation so far


def test_arxiv_long_reaches_the_papers_16k_where_the_shipped_table_stops_at_4k():
    shipped_in, _ = load_length_table("arxiv-lengths")
    long_in, long_out = load_length_table("arxiv-long")
    assert shipped_in.max() <= 4096 < np.percentile(long_in, 75)
    assert (long_in + long_out).max() <= 16384 and long_in.min() >= 1024


def test_poisson_workload_from_sharegpt():
    workload = synthetic_workload(500, 8.0, "table:sharegpt", seed=3)
    assert len(workload) == 500 and workload.input_tokens.max() <= 2048
    assert abs(workload.mean_rate_rps - 8.0) < 1.5
