"""What the fleet simulator is asked (a :class:`FleetSpec`) and what it answers (a
:class:`Prediction`).

The spec holds the pipeline's rules, taken from a config (:func:`pipeline_rules`), the fleet's
shape (workers, sites, the WAN) and the measured costs of each stage (:class:`StageCosts`, from a
calibration run or given by hand).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dockyard.algorithms.grpo import MasterConfig


class ImpossibleFleet(ValueError):
    """A fleet the simulator cannot model (no workers, a site with none, a negative cost...)."""


@dataclass(frozen=True)
class StageCosts:
    """Seconds and bytes each stage costs, measured on one machine (no WAN)."""

    #: One generation batch of ``n`` groups takes ``gen_batch_s + n × gen_group_s``.
    gen_group_s: float
    gen_batch_s: float
    #: One trainer step (``timing/train_step_s``) and publishing its weights.
    train_step_s: float
    publish_s: float
    #: The trainer's own bookkeeping per step (metrics, ledger, status, backlog reads): the
    #: step's period less its wait for data, training and publishing.
    step_overhead_s: float
    #: One group through one scorer.
    score_s: float
    #: A worker loading a weight version already at its site (``refit.done`` seconds).
    refit_s: float
    #: One pass through the broker on one machine (prompt → worker, rollout → scorer, scored →
    #: trainer: three per group), fetch polling included; fitted on the calibration run.
    hop_s: float
    #: One full weight snapshot, and one scored group on the wire.
    weight_bytes: int
    rollout_bytes: int

    def problems(self) -> list[str]:
        return [
            f"{name} must be ≥ 0, not {value}"
            for name, value in vars(self).items()
            if not value >= 0  # also refuses NaN
        ]


@dataclass(frozen=True)
class PipelineRules:
    """dockyard's own rules, from the config."""

    num_prompts_per_step: int  # grpo.num_prompts_per_step: groups per trainer step
    async_enabled: bool  # grpo.async_grpo.enabled
    max_age: int  # grpo.async_grpo.max_trajectory_age_steps (0 when sync)
    fetch_batch: int  # data_plane.consumer.fetch_batch: groups a worker takes at once
    steps: int  # how many trainer steps to simulate
    patches: bool  # data_plane.weight_transport.patches.enabled
    snapshot_every: int  # data_plane.weight_transport.patches.snapshot_every
    #: Groups one scorer scores at once (a scorer serving every environment keeps 8 in flight,
    #: consumers/scorer.py; ``env.<name>.max_concurrency`` for one pinned to an environment).
    scorer_concurrency: int = 8
    #: How long a worker waits for the version its groups were dispatched at before it
    #: generates with the weights it has (``RolloutWorker``'s ``max_refit_wait_s``).
    max_refit_wait_s: float = 10.0

    @property
    def in_flight_capacity(self) -> int:
        """The dispatcher's budget (dockyard/producers/dispatcher.py ``capacity``)."""
        per_step = self.num_prompts_per_step
        return (self.max_age + 1) * per_step if self.async_enabled else per_step


@dataclass(frozen=True)
class FleetSpec:
    rules: PipelineRules
    costs: StageCosts
    workers: int
    #: Rollout sites; workers (and ``scorers_per_site`` scorers each) are spread over them.
    sites: int = 1
    scorers_per_site: int = 1
    #: The link between the trainer's site and each rollout site; ``None`` = co-located.
    wan_mbit: float | None = None
    latency_ms: float = 0.0
    #: Full snapshot bytes ÷ patch bytes (docs/benchmarks.md, "Sparse weight patches").
    patch_ratio: float | None = None
    #: Every role on one machine of this many cores (each stage queues for one); ``None`` =
    #: each role on its own hardware.
    shared_cores: int | None = None

    def problems(self) -> list[str]:
        found = [f"costs: {p}" for p in self.costs.problems()]
        if self.workers < 1:
            found.append(f"workers must be ≥ 1, not {self.workers}")
        if self.sites < 1:
            found.append(f"sites must be ≥ 1, not {self.sites}")
        elif self.workers < self.sites:
            found.append(f"{self.sites} sites need at least one worker each, not {self.workers}")
        if self.scorers_per_site < 1:
            found.append(f"scorers per site must be ≥ 1, not {self.scorers_per_site}")
        if self.wan_mbit is not None and not self.wan_mbit > 0:
            found.append(f"wan_mbit must be > 0, not {self.wan_mbit}")
        if not self.latency_ms >= 0:
            found.append(f"latency_ms must be ≥ 0, not {self.latency_ms}")
        if self.shared_cores is not None and self.shared_cores < 1:
            found.append(f"shared_cores must be ≥ 1, not {self.shared_cores}")
        if self.rules.steps < 1:
            found.append(f"steps must be ≥ 1, not {self.rules.steps}")
        if self.rules.patches and self.patch_ratio is None:
            found.append(
                "data_plane.weight_transport.patches.enabled is true: give the patch ratio "
                "(full bytes ÷ patch bytes; docs/benchmarks.md measures 54-98× at lr 1e-6, "
                "12-20× at lr 1e-5)"
            )
        if self.patch_ratio is not None and not self.patch_ratio >= 1:
            found.append(f"patch_ratio must be ≥ 1, not {self.patch_ratio}")
        return found

    def validated(self) -> FleetSpec:
        if problems := self.problems():
            raise ImpossibleFleet("; ".join(problems))
        return self


def pipeline_rules(config: MasterConfig, *, steps: int | None = None) -> PipelineRules:
    """The rules a run of ``config`` follows."""
    grpo = config.grpo
    plane = config.data_plane
    patches = plane.weight_transport.patches if plane is not None else None
    return PipelineRules(
        num_prompts_per_step=grpo.num_prompts_per_step,
        async_enabled=grpo.async_grpo.enabled,
        max_age=grpo.async_grpo.max_trajectory_age_steps if grpo.async_grpo.enabled else 0,
        # The in-memory plane (data_plane: null) fetches 16 at a time, as the consumers do.
        fetch_batch=plane.consumer.fetch_batch if plane is not None else 16,
        steps=steps if steps is not None else grpo.max_num_steps,
        patches=bool(patches and patches.enabled),
        snapshot_every=patches.snapshot_every if patches is not None else 1,
    )


@dataclass
class Prediction:
    """What a simulated run did. Rates are over the steady state: from the end of the first
    step to the end of the last (the measured runs' start-up is not the fleet's)."""

    steps: int
    wall_s: float  # simulated time from the first dispatch to the end of the last step
    steady_s: float  # from the end of the first step to the end of the last
    groups_trained: int
    groups_dropped_stale: int
    groups_per_s: float
    steps_per_s: float
    trainer_busy_s: float  # steps × (train step + publish + bookkeeping)
    trainer_idle_fraction: float  # over the steady state: 1 − busy ÷ steady_s
    #: Trained groups by age in steps (trainer version at training − behaviour version).
    staleness: dict[int, int] = field(default_factory=dict)
    #: Seconds from a version's publication until every worker had loaded it (mean).
    weight_propagation_s: float = 0.0
    weight_bytes_on_wan: int = 0

    @property
    def staleness_mean(self) -> float:
        total = sum(self.staleness.values())
        return sum(a * n for a, n in self.staleness.items()) / total if total else 0.0

    @property
    def staleness_max(self) -> int:
        return max(self.staleness, default=0)


#: Bytes per response token of a rollout's arrays before compression: int32 token id, float32
#: log-prob, int64 weight version, bool mask (docs/wire-format.md).
_BYTES_PER_TOKEN = 4 + 4 + 8 + 1


def rollout_bytes_bound(config: MasterConfig) -> int:
    """An upper bound of one group on the wire: every sample at its longest, uncompressed."""
    tokens = config.policy.max_total_sequence_length
    return config.grpo.num_generations_per_prompt * tokens * _BYTES_PER_TOKEN
