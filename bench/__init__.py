"""Benchmarks: each script prints figures; see the README for the commands and what they measured."""
