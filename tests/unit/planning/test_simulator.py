"""The fleet simulator against what follows from the pipeline's rules, worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest

from dockyard.planning.fleet import FleetSpec, ImpossibleFleet, PipelineRules, StageCosts
from dockyard.planning.simulator import simulate

FREE = StageCosts(
    gen_group_s=0.0,
    gen_batch_s=0.0,
    train_step_s=0.0,
    publish_s=0.0,
    step_overhead_s=0.0,
    hop_s=0.0,
    score_s=0.0,
    refit_s=0.0,
    weight_bytes=1_000_000,
    rollout_bytes=0,
)


def rules(**changes) -> PipelineRules:
    base = PipelineRules(
        num_prompts_per_step=4,
        async_enabled=True,
        max_age=1,
        fetch_batch=1,
        steps=20,
        patches=False,
        snapshot_every=1,
    )
    return dataclasses.replace(base, **changes)


def costs(**changes) -> StageCosts:
    return dataclasses.replace(FREE, **changes)


def test_one_worker_whose_generation_dominates_makes_one_group_per_generation_time():
    generation_s = 2.0
    spec = FleetSpec(rules(), costs(gen_group_s=generation_s, train_step_s=1e-3), workers=1)
    prediction = simulate(spec)
    assert prediction.groups_per_s == pytest.approx(1 / generation_s, rel=1e-6)
    assert prediction.steps_per_s == pytest.approx(1 / (4 * generation_s), rel=1e-6)


def test_workers_that_generate_in_parallel_add_up_while_the_budget_keeps_them_busy():
    # Budget (max_age + 1) × 4 = 16 groups in flight: enough for 4 workers at one group each.
    spec = FleetSpec(rules(max_age=3), costs(gen_group_s=1.0), workers=4)
    assert simulate(spec).groups_per_s == pytest.approx(4.0, rel=1e-6)


def test_a_trainer_that_dominates_sets_the_pace_and_is_never_idle():
    train_s = 3.0
    spec = FleetSpec(rules(), costs(gen_group_s=0.01, train_step_s=train_s), workers=2)
    prediction = simulate(spec)
    assert prediction.steps_per_s == pytest.approx(1 / train_s, rel=1e-6)
    assert prediction.trainer_idle_fraction == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("workers", [1, 3])
def test_the_idle_fraction_is_the_part_of_the_wall_not_spent_on_steps(workers):
    busy = {"train_step_s": 0.5, "publish_s": 0.1, "step_overhead_s": 0.05}
    spec = FleetSpec(rules(), costs(gen_group_s=1.0, **busy), workers=workers)
    p = simulate(spec)
    per_step = sum(busy.values())
    assert p.trainer_idle_fraction == pytest.approx(1 - per_step * (p.steps - 1) / p.steady_s)
    assert p.trainer_busy_s == pytest.approx(per_step * p.steps)
    assert 0 < p.trainer_idle_fraction < 1


@pytest.mark.parametrize("max_age", [0, 1, 3])
@pytest.mark.parametrize("workers", [1, 4, 9])
def test_no_trained_group_is_older_than_the_bound(max_age, workers):
    # A slow link and a slow refit make versions reach workers late: the case that drops.
    spec = FleetSpec(
        rules(max_age=max_age, fetch_batch=3),
        costs(gen_group_s=0.3, gen_batch_s=0.1, train_step_s=0.2, refit_s=0.4, score_s=0.05),
        workers=workers,
        sites=1,
        wan_mbit=8.0,
        latency_ms=150.0,
    )
    p = simulate(spec)
    assert p.staleness_max <= max_age
    assert sum(p.staleness.values()) == p.groups_trained == 20 * 4


def test_weights_slower_than_the_refit_wait_make_stale_groups_that_are_dropped_not_trained():
    # A version takes 100 MB × 8 / 8 Mbit/s = 100 s to cross, far past the worker's 10 s wait:
    # workers generate with old weights, and the trainer drops what the bound forbids.
    spec = FleetSpec(
        rules(max_age=1, steps=6),
        costs(gen_group_s=0.5, train_step_s=0.2, weight_bytes=100_000_000),
        workers=4,
        wan_mbit=8.0,
    )
    p = simulate(spec)
    assert p.groups_dropped_stale > 0
    assert p.staleness_max <= 1


def test_sync_grpo_trains_only_on_the_current_weights():
    spec = FleetSpec(
        rules(async_enabled=False, max_age=0), costs(gen_group_s=1.0, refit_s=0.5), workers=3
    )
    p = simulate(spec)
    assert p.staleness == {0: 80}
    assert p.groups_dropped_stale == 0


def test_each_version_crosses_each_sites_link_once_as_a_snapshot_or_a_patch():
    full, ratio, every, steps, sites = 1_000_000, 50.0, 5, 20, 3
    spec = FleetSpec(
        rules(steps=steps, patches=True, snapshot_every=every),
        costs(gen_group_s=1.0, weight_bytes=full),
        workers=3,
        sites=sites,
        wan_mbit=100.0,
        patch_ratio=ratio,
    )
    # Versions 1..20 are published; 5, 10, 15, 20 are snapshots, the other 16 patches.
    snapshots = steps // every
    expected = sites * (snapshots * full + (steps - snapshots) * round(full / ratio))
    assert simulate(spec).weight_bytes_on_wan == expected


def test_a_version_reaches_an_idle_remote_worker_after_its_bytes_its_latency_and_its_refit():
    full, mbit, latency_ms, refit_s = 12_500_000, 100.0, 40.0, 0.3  # 1 s on the link
    # Sync: when a version is published every group has been trained, so the worker is idle
    # and the link carries nothing else; the worker loads the version as soon as it lands.
    spec = FleetSpec(
        rules(steps=5, async_enabled=False, max_age=0),
        costs(gen_group_s=1.0, refit_s=refit_s, weight_bytes=full),
        workers=1,
        wan_mbit=mbit,
        latency_ms=latency_ms,
    )
    transfer_s = full * 8 / (mbit * 1e6) + latency_ms / 1000
    assert simulate(spec).weight_propagation_s == pytest.approx(transfer_s + refit_s, rel=1e-9)


def test_patches_shorten_the_trainer_idle_time_on_a_slow_link_in_sync_grpo():
    # Sync: every step waits for its version to cross the link, so its bytes are on the
    # critical path; a patch of 1/50 of them must make steps faster.
    base = dict(workers=2, wan_mbit=10.0, latency_ms=20.0)
    common = costs(gen_group_s=0.1, train_step_s=0.1, weight_bytes=10_000_000)
    full = simulate(FleetSpec(rules(async_enabled=False, max_age=0), common, **base))
    patched = simulate(
        FleetSpec(
            rules(async_enabled=False, max_age=0, patches=True, snapshot_every=1000),
            common,
            patch_ratio=50.0,
            **base,
        )
    )
    assert patched.steps_per_s > full.steps_per_s
    assert patched.trainer_idle_fraction < full.trainer_idle_fraction


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"workers": 0}, "workers must be ≥ 1"),
        ({"workers": 2, "sites": 3}, "3 sites need at least one worker each"),
        ({"wan_mbit": 0.0}, "wan_mbit must be > 0"),
        ({"latency_ms": -1.0}, "latency_ms must be ≥ 0"),
        ({"costs": costs(train_step_s=float("nan"))}, "train_step_s must be ≥ 0"),
        ({"rules": rules(patches=True)}, "give the patch ratio"),
        ({"patch_ratio": 0.5}, "patch_ratio must be ≥ 1"),
        ({"rules": rules(steps=0)}, "steps must be ≥ 1"),
        ({"shared_cores": 0}, "shared_cores must be ≥ 1"),
    ],
)
def test_impossible_fleets_are_refused_with_the_reason(changes, says):
    spec = dataclasses.replace(FleetSpec(rules(), costs(gen_group_s=1.0), workers=1), **changes)
    with pytest.raises(ImpossibleFleet, match=says):
        simulate(spec)


def test_on_one_shared_core_a_step_costs_the_sum_of_its_work():
    # Every stage queues for the one core: per step it generates 4 groups (4 × 0.5 s), scores
    # them (4 × 0.1 s) and trains (1 s), one after another: 3.4 s a step.
    # Over many steps (the window's edges cut through pipelined work).
    spec = FleetSpec(
        rules(steps=400),
        costs(gen_group_s=0.5, score_s=0.1, train_step_s=1.0),
        workers=2,
        shared_cores=1,
    )
    assert simulate(spec).steps_per_s == pytest.approx(1 / (4 * 0.5 + 4 * 0.1 + 1.0), rel=1e-2)


def test_a_scorer_scores_as_many_groups_at_once_as_its_concurrency():
    # Scoring dominates (1 s a group); 16 groups in flight, one scorer keeping 8 at once.
    spec = FleetSpec(
        rules(steps=400, max_age=3, scorer_concurrency=8),
        costs(gen_group_s=0.001, score_s=1.0),
        workers=4,
    )
    assert simulate(spec).groups_per_s == pytest.approx(8.0, rel=1e-2)
