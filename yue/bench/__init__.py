"""Benchmarks: the harness, its peers, and the development prompt set."""
