"""Plan spaces and CP-SAT searches: uniform, uneven and mixed pipelines, serving, DLRM placement."""
