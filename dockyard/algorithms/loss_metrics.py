"""The named scalars :class:`~dockyard.algorithms.loss.ClippedPGLoss` reports per micro-batch.

Each micro-batch reports its *share* of the full-batch metric: means are divided by the global
token or sequence count, exactly like the loss. :func:`merge_loss_metrics` combines the shares of
all micro-batches of a step into the full-batch values (sums for shares and counts, ``min`` /
``max`` for extrema), so the numbers logged for a step do not depend on the micro-batch size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Literal

MergeRule = Literal["sum", "min", "max"]


def _metric(rule: MergeRule = "sum") -> float:
    return field(metadata={"merge": rule})  # type: ignore[no-any-return]  # dataclasses.field() types as its default; a metadata-only field has none


@dataclass(frozen=True)
class LossMetrics:
    """Diagnostics of one loss evaluation (see the module docstring for how they combine).

    Extrema (``*_min`` / ``*_max``) are ``+inf`` / ``-inf`` when no token was valid.
    """

    loss: float = _metric()
    actor_loss: float = _metric()
    kl_loss: float = _metric()  # β·KL as it enters the loss (0 with use_kl_in_reward)
    kl: float = _metric()  # the reference KL estimate itself (0 without reference log-probs)
    nll_loss: float = _metric()  # positive-example NLL, before its weight
    ratio_mean: float = _metric()
    ratio_min: float = _metric("min")
    ratio_max: float = _metric("max")
    ratio_clamped_mean: float = _metric()
    clip_fraction: float = _metric()  # tokens whose ratio lay outside [1−ε_low, 1+ε_high]
    dual_clip_fraction: float = _metric()  # tokens where the dual-clip bound −A·c was taken
    is_weight_mean: float = _metric()  # before truncation
    is_weight_min: float = _metric("min")
    is_weight_max: float = _metric("max")
    is_truncated_fraction: float = _metric()  # weights clamped or masked by truncation
    token_mult_prob_error: float = _metric()  # mean exp(|gen − prev|): 1 when engine agrees
    gen_kl_error: float = _metric()  # k3 estimate of KL(π_gen ‖ π_old)
    policy_kl_error: float = _metric()  # k3 estimate of KL(π_old ‖ π_gen)
    approx_entropy: float = _metric()  # −mean(exp(lp − gen)·lp)
    num_valid_tokens: float = _metric()
    num_valid_samples: float = _metric()

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


_RULES: dict[str, MergeRule] = {f.name: f.metadata["merge"] for f in fields(LossMetrics)}
_COMBINE: dict[MergeRule, Callable[[float, float], float]] = {
    "sum": lambda a, b: a + b,
    "min": min,
    "max": max,
}


def merge_loss_metrics(parts: Iterable[LossMetrics]) -> LossMetrics:
    """Combine the micro-batch metrics of one step into the full-batch metrics."""
    merged: dict[str, float] | None = None
    for part in parts:
        values = part.as_dict()
        if merged is None:
            merged = values
            continue
        for name, value in values.items():
            merged[name] = _COMBINE[_RULES[name]](merged[name], value)
    if merged is None:
        raise ValueError("merge_loss_metrics needs at least one LossMetrics")
    return LossMetrics(**merged)


def metric_names() -> list[str]:
    return list(_RULES)
