"""Workloads: arrival times and lengths with rate scaling and windows; the shipped and raw
public traces, synthetic arrivals and lengths, length tables, long-output and multi-round
session workloads."""
