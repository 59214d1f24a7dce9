"""Numeric helpers shared by the vectorised cost models."""

from __future__ import annotations

from collections.abc import Iterable
from functools import reduce
from operator import add

import numpy as np
from numpy.typing import NDArray


def ordered_sum(terms: Iterable[NDArray[np.float64]]) -> NDArray[np.float64]:
    """Add arrays left to right. Unlike ``np.sum(..., axis=0)`` (pairwise for one plan, sequential for many), the
    rounding does not depend on how many plans are evaluated together: a scalar call is bitwise equal to the same
    plan inside a batch."""
    return np.asarray(reduce(add, terms), dtype=np.float64)
