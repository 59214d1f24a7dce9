"""Units and unit conversions, each defined once. SI inside the model; these convert at the solver's integer
scales and at the human edges (reports)."""

from __future__ import annotations

US = 1e6  # microseconds per second: the integer time unit of the training and serving searches
NS = 1e9  # nanoseconds per second: the integer unit of finer searches (DLRM placement, serving GPU-time per token)
SECONDS_PER_HOUR = 3600.0
J_PER_KWH = 3.6e6  # joules per kilowatt-hour
MB = 1e6  # bytes per megabyte (decimal, as memory sizes are reported)
GB = 1e9  # bytes per gigabyte (decimal)
GIB = 2.0**30  # bytes per gibibyte (HBM capacities are binary)
