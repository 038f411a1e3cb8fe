"""Scoring a run, simulated or live, from its per-request records: the papers' metrics
(TTFT, TPOT, ITL, attainment and their variants), goodput search, text, JSON and CSV
reports, and plots."""
