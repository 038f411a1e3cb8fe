"""Scoring a run, simulated or live, from its per-request records: the papers' metrics
(TTFT, TPOT, ITL, attainment and their variants), goodput search, text, JSON and CSV
reports, plots, and the views of a run (`views.py`) that its `report.html` and the live
dashboard draw with plotly (`report_page.py`, `assets/`)."""
