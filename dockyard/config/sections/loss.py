"""``loss_fn``: the clipped policy-gradient loss (:class:`ClippedPGLossConfig`).

Defaults follow the reference system (see ``shared/notes/algorithms.md``). The cross-field rules
live here, on the model, so constructing the config in code and validating a YAML file at launch
run the very same checks.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dockyard.config.base import Section, check_finite
from dockyard.config.errors import ConfigIssue

TruncatedISType = Literal["tis", "icepop", "seq-mask-tis"]
KLType = Literal["k1", "k2", "k3"]


class ClippedPGLossConfig(Section):
    """``loss_fn``: see :mod:`dockyard.algorithms.loss` for the formulas each switch selects."""

    ratio_clip_min: float = Field(0.2, ge=0.0, description="low clip ε: ratio >= 1 - ε")
    ratio_clip_max: float = Field(0.2, ge=0.0, description="high clip ε: ratio <= 1 + ε")
    ratio_clip_c: float | None = Field(None, description="dual-clip constant c > 1 (A < 0 only)")
    reference_policy_kl_penalty: float = Field(0.01, ge=0.0, description="β of the KL penalty")
    reference_policy_kl_type: KLType = "k3"
    kl_input_clamp_value: float | None = Field(20.0, gt=0.0, description="clamp of ref − lp")
    kl_output_clamp_value: float | None = Field(10.0, gt=0.0, description="clamp of the KL")
    use_kl_in_reward: bool = Field(
        False, description="fold −β·KL into the advantages instead of the loss"
    )
    use_on_policy_kl_approximation: bool = Field(
        False, description="weight the KL term by sg(exp(lp − gen))"
    )
    use_importance_sampling_correction: bool = Field(
        False, description="weight the surrogate by sg(exp(prev − gen))"
    )
    truncated_importance_sampling_type: TruncatedISType | None = None
    truncated_importance_sampling_ratio: float | None = Field(
        None, gt=0.0, description="upper bound of the IS weight"
    )
    truncated_importance_sampling_ratio_min: float | None = Field(
        None, ge=0.0, description="lower bound of the IS weight"
    )
    token_level_loss: bool = Field(True, description="false = sequence-level reduction")
    sequence_level_importance_ratios: bool = Field(False, description="GSPO")
    disable_ppo_ratio: bool = Field(False, description="REINFORCE form −A·lp")
    force_on_policy_ratio: bool = Field(False, description="π_old := sg(π_θ), ratio ≡ 1")
    use_cispo: bool = Field(False, description="−A·sg(clamp(r))·lp")
    positive_example_nll_weight: float = Field(
        0.0, ge=0.0, description="μ of the NLL on samples with reward > 0 (VAPO)"
    )

    def rule_issues(self) -> list[ConfigIssue]:
        issues: list[ConfigIssue] = []
        for name in (
            "ratio_clip_min",
            "ratio_clip_max",
            "ratio_clip_c",
            "reference_policy_kl_penalty",
            "kl_input_clamp_value",
            "kl_output_clamp_value",
            "truncated_importance_sampling_ratio",
            "truncated_importance_sampling_ratio_min",
            "positive_example_nll_weight",
        ):
            issues += check_finite(getattr(self, name), name, "use a finite value")
        if self.ratio_clip_c is not None and not self.ratio_clip_c > 1.0:
            issues.append(
                ConfigIssue("ratio_clip_c", f"dual clip needs c > 1, got {self.ratio_clip_c}")
            )
        issues += self._objective_issues()
        issues += self._kl_issues()
        issues += self._truncation_issues()
        return issues

    def _objective_issues(self) -> list[ConfigIssue]:
        issues: list[ConfigIssue] = []
        if self.sequence_level_importance_ratios and self.token_level_loss:
            issues.append(
                ConfigIssue(
                    "sequence_level_importance_ratios",
                    "sequence-level (GSPO) ratios need sequence-level loss: "
                    "set loss_fn.token_level_loss=false",
                )
            )
        if self.use_cispo:
            if not self.token_level_loss:
                issues.append(
                    ConfigIssue(
                        "use_cispo",
                        "CISPO is a token-level loss: set loss_fn.token_level_loss=true",
                    )
                )
            if self.disable_ppo_ratio:
                issues.append(
                    ConfigIssue(
                        "use_cispo",
                        "CISPO needs the PPO ratio: unset loss_fn.disable_ppo_ratio",
                    )
                )
            if self.sequence_level_importance_ratios:
                issues.append(
                    ConfigIssue(
                        "use_cispo",
                        "CISPO uses token ratios: unset loss_fn.sequence_level_importance_ratios",
                    )
                )
        if self.disable_ppo_ratio and self.sequence_level_importance_ratios:
            issues.append(
                ConfigIssue(
                    "disable_ppo_ratio",
                    "REINFORCE form has no ratio: unset loss_fn.sequence_level_importance_ratios",
                )
            )
        if self.disable_ppo_ratio and self.force_on_policy_ratio:
            issues.append(
                ConfigIssue(
                    "force_on_policy_ratio",
                    "has no effect with loss_fn.disable_ppo_ratio=true: unset one of them",
                )
            )
        if self.ratio_clip_c is not None and (self.disable_ppo_ratio or self.use_cispo):
            form = "loss_fn.disable_ppo_ratio" if self.disable_ppo_ratio else "loss_fn.use_cispo"
            issues.append(
                ConfigIssue(
                    "ratio_clip_c",
                    f"dual clip bounds −A·ratio and never binds with {form}=true "
                    "(its surrogate is −A·lp-shaped): set loss_fn.ratio_clip_c=null",
                )
            )
        return issues

    def _kl_issues(self) -> list[ConfigIssue]:
        issues: list[ConfigIssue] = []
        if self.use_kl_in_reward and self.reference_policy_kl_penalty == 0:
            issues.append(
                ConfigIssue(
                    "use_kl_in_reward",
                    "folds β·KL into the reward but loss_fn.reference_policy_kl_penalty is 0: "
                    "set a positive penalty or unset loss_fn.use_kl_in_reward",
                )
            )
        if self.use_kl_in_reward and self.sequence_level_importance_ratios:
            # KL folded into the advantages makes them per token (A_t − β·KL_t, or REINFORCE++'s
            # return to go); GSPO's one ratio per sequence gives every token of a sequence the
            # same weight, so the gradient sees only the sequence mean of A_t.
            issues.append(
                ConfigIssue(
                    "sequence_level_importance_ratios",
                    "GSPO's sequence ratio averages the per-token advantages that "
                    "loss_fn.use_kl_in_reward=true makes over each sequence (every token gets "
                    "its sequence's mean advantage, so the KL penalty no longer falls on the "
                    "tokens that incurred it): unset loss_fn.use_kl_in_reward (the KL term "
                    "stays in the loss) or use token ratios",
                )
            )
        if self.use_kl_in_reward and self.use_on_policy_kl_approximation:
            issues.append(
                ConfigIssue(
                    "use_on_policy_kl_approximation",
                    "weights the KL term of the loss, which loss_fn.use_kl_in_reward=true "
                    "removes: unset one of them",
                )
            )
        return issues

    def _truncation_issues(self) -> list[ConfigIssue]:
        kind = self.truncated_importance_sampling_type
        low = self.truncated_importance_sampling_ratio_min
        high = self.truncated_importance_sampling_ratio
        if kind is None:
            ignored = [
                f"loss_fn.{name}"
                for name, value in (
                    ("truncated_importance_sampling_ratio", high),
                    ("truncated_importance_sampling_ratio_min", low),
                )
                if value is not None
            ]
            if ignored:
                return [
                    ConfigIssue(
                        "truncated_importance_sampling_type",
                        f"{' and '.join(ignored)} set but no truncation type: "
                        "choose tis, icepop or seq-mask-tis, or unset the bounds",
                    )
                ]
            return []
        issues: list[ConfigIssue] = []
        if not self.use_importance_sampling_correction:
            issues.append(
                ConfigIssue(
                    "truncated_importance_sampling_type",
                    f"{kind!r} needs loss_fn.use_importance_sampling_correction=true",
                )
            )
        if high is None:
            issues.append(
                ConfigIssue(
                    "truncated_importance_sampling_ratio",
                    f"{kind!r} needs an upper bound (e.g. 2.0 for tis, 5.0 for icepop)",
                )
            )
        if kind in ("icepop", "seq-mask-tis") and low is None:
            issues.append(
                ConfigIssue(
                    "truncated_importance_sampling_ratio_min",
                    f"{kind!r} needs a lower bound (e.g. 0.5 for icepop, 0.999 for seq-mask-tis)",
                )
            )
        if low is not None and high is not None and low > high:
            issues.append(
                ConfigIssue(
                    "truncated_importance_sampling_ratio_min",
                    f"lower bound {low} exceeds the upper bound {high}",
                )
            )
        if kind == "seq-mask-tis" and self.sequence_level_importance_ratios:
            issues.append(
                ConfigIssue(
                    "truncated_importance_sampling_type",
                    "seq-mask-tis masks sequences but keeps token weights; with "
                    "loss_fn.sequence_level_importance_ratios=true use tis or icepop",
                )
            )
        return issues
