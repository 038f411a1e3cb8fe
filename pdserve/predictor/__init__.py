"""ARES's hidden-state remaining-length predictor: record, train, evaluate (`cli.py`)."""
