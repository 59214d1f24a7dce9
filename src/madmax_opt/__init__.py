"""madmax-opt: throughput-optimal, memory-feasible parallelization plans for large-model training and serving."""

__version__ = "0.1.0"
