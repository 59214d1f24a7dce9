"""Specs, workload lowering and pure cost functions: training, serving and recommender models."""
