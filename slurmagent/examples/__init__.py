"""Example workloads: real training (digits_mlp) and a synthetic step loop for benchmarks."""
