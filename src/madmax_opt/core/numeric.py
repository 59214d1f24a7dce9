"""Numeric helpers shared by the vectorised cost models."""

from __future__ import annotations

from collections.abc import Iterable
from functools import reduce
from operator import add

import numpy as np
from numpy.typing import NDArray

Arr = NDArray[np.float64]  # a column of floats, one entry per plan
IntArr = NDArray[np.int64]  # a column of integers, one entry per plan


def ordered_sum(terms: Iterable[Arr]) -> Arr:
    """Add arrays left to right. Unlike ``np.sum(..., axis=0)`` (pairwise for one plan, sequential for many), the
    rounding does not depend on how many plans are evaluated together: a scalar call is bitwise equal to the same
    plan inside a batch."""
    return np.asarray(reduce(add, terms), dtype=np.float64)
