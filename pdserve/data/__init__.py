"""Data shipped with the package: traces, length tables, Vidur's A100 operator profiles and
their fitted curves, the byte-level tokenizer, and their attribution (`ATTRIBUTION.md`)."""
