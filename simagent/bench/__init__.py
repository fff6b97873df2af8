"""Benchmarks: token usage per workflow (the bench) and the kernel micro-benchmarks."""
