"""Validation, calibration, paper studies, sweeps, sensitivity and benchmarks."""
