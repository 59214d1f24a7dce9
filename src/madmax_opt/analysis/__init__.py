"""Exact evaluation of plans, bottleneck attribution and event-level step simulation."""
