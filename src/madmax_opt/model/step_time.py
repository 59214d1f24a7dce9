"""The training step time as one linear form over the pipeline's stage times, read by every consumer.

    T = m * t_max + (p - 1)/v * t_mean + dp_max + opt_max      (1F1B / interleaved 1F1B, Narayanan et al. 2021)

t_s: time per micro-batch of stage s (``training.stage_costs``), t_max its largest (the bottleneck), t_mean its mean,
dp_s the exposed DP sync and opt_s the optimizer step per step, m micro-batches, p stages, v virtual chunks. The
second term is the warm-up and cool-down bubble (``pipeline.bubble_time_s``). Three readers evaluate this one form:

- numpy (``training.training_terms``, ``training.staged_terms``): ``StepForm.terms`` gives the additive step terms
  (the bottleneck stage's terms times m, the bubble, DP sync, optimizer);
- CP-SAT (``search.stages``): ``StepForm.integer_coefficients`` is p v x the form with t_mean = sum_s t_s / p, whose
  coefficients are integers when m is: p v T = p v m t_max + (p - 1) sum_s t_s + p v dp_max + p v opt_max;
- the lower bounds (``search.stages``, ``search.stage_bounds``): the same coefficients over lower bounds of each
  term (every coefficient is non-negative, so a bound per term bounds T).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from madmax_opt.core.numeric import Arr
from madmax_opt.model.pipeline import bubble_time_s

# the named terms of the integer form (CP-SAT, bounds): bottleneck stage, sum over stages, DP sync, optimizer
INTEGER_TERMS: tuple[str, ...] = ("stage_max", "stage_sum", "dp_max", "optimizer_max")


@dataclass(frozen=True)
class StepForm:
    """The step-time form of pipelines with ``n_micro`` micro-batches, ``pp`` stages and ``vpp`` chunks each."""

    n_micro: Arr
    pp: Arr
    vpp: Arr

    @property
    def stage_max(self) -> Arr:
        """Coefficient of the bottleneck stage's time per micro-batch: m."""
        return self.n_micro

    @property
    def stage_mean(self) -> Arr:
        """Coefficient of the mean stage time per micro-batch: (p - 1)/v (the bubble)."""
        return bubble_time_s(self.pp, self.vpp, np.ones_like(self.pp))

    def terms(self, bottleneck: dict[str, Arr], t_mean: Arr, dp_s: Arr, optimizer_s: Arr) -> dict[str, Arr]:
        """The additive step terms (s): every term of the bottleneck stage x m, then bubble, DP sync, optimizer."""
        out = {k: self.stage_max * v for k, v in bottleneck.items()}
        out["bubble"] = bubble_time_s(self.pp, self.vpp, t_mean)  # = stage_mean x t_mean
        out["dp_comm"] = dp_s
        out["optimizer"] = optimizer_s
        return out

    def mean_bound(self, t_sum: Arr) -> Arr:
        """T without DP sync and optimizer at its least over stage times summing to ``t_sum``: t_max >= t_mean =
        t_sum / p, so T >= (m + (p - 1)/v) t_sum / p."""
        return (self.n_micro + (self.pp - 1) / self.vpp) / self.pp * t_sum

    @property
    def scale(self) -> Arr:
        """p v: the factor that makes the form integral (``integer_coefficients``)."""
        return self.pp * self.vpp

    def integer_coefficients(self) -> dict[str, Arr]:
        """p v x the form over ``INTEGER_TERMS`` (t_mean = sum_s t_s / p): p v m, p - 1, p v, p v; m is rounded to
        the integer it is on every valid plan (global_batch = dp x mbs x m)."""
        pv = self.scale
        return {"stage_max": pv * np.rint(self.n_micro), "stage_sum": self.pp - 1.0, "dp_max": pv, "optimizer_max": pv}

    def integer_value(self, values: dict[str, Arr]) -> Arr:
        """p v T from a value (or a lower bound) of each of ``INTEGER_TERMS``."""
        coeff = self.integer_coefficients()
        return np.asarray(sum(coeff[k] * values[k] for k in INTEGER_TERMS), dtype=np.float64)


def step_form(n_micro: Arr | float, pp: Arr | float, vpp: Arr | float) -> StepForm:
    """``StepForm`` of float arrays (scalars become one-element arrays)."""
    return StepForm(*(np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in (n_micro, pp, vpp)))
