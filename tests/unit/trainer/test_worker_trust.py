"""Judging rollout workers by their behaviour log-probs' agreement with the trainer's.

Groups are real scored rollouts (behaviour log-prob −0.1 on every token, the factories'), stacked
by the trainer's ``build_batch``; the trainer's log-probs are chosen per sample, so the expected
agreement follows from the definitions: token_mult_prob_error = mean exp(|behaviour − trainer|),
gen_kl = mean k3 = exp(trainer − behaviour) − 1 − (trainer − behaviour).
"""

from __future__ import annotations

import math

import pytest
import torch

from dockyard.config.sections.grpo import WorkerTrustConfig
from dockyard.consumers.trainer.batch import build_batch
from dockyard.consumers.trainer.worker_trust import WorkerTrust, sample_agreements, workers_of
from dockyard.schemas import ScoredRollout
from tests.integration.roles.factories import TOKENIZER, prompt_group
from tests.unit.trainer.test_trainer_accounting import answer

BEHAVIOUR = -0.1  # every token's behaviour log-prob in the factories' rollouts


def group(group_id: str, *workers: str) -> ScoredRollout:
    prompt = prompt_group(group_id, generations=len(workers))
    return answer(prompt, 0, lambda _: [(w, 0.0, 1.0) for w in workers])


def measure(groups: list[ScoredRollout], offsets: dict[str, float]):
    """Agreements when the trainer's log-prob is the behaviour's minus ``offsets[worker]``."""
    batch = build_batch(groups, TOKENIZER.pad_token_id)
    workers = workers_of(groups)
    shift = torch.tensor([offsets[w] for w in workers])[:, None]
    trainer = (batch.generation_logprobs - shift) * batch.token_mask
    return batch, sample_agreements(batch, trainer, workers)


def test_agreement_is_the_loss_metrics_definitions_per_sample() -> None:
    groups = [group("g0", "w-a", "w-b")]
    batch, agreements = measure(groups, {"w-a": 0.0, "w-b": 0.5})
    tokens = batch.token_mask.sum(dim=-1).tolist()
    a, b = agreements
    assert (a.worker, b.worker) == ("w-a", "w-b")
    assert a.tokens == tokens[0] and b.tokens == tokens[1]
    assert a.mult_error_sum == pytest.approx(tokens[0] * 1.0)
    assert a.gen_kl_sum == pytest.approx(0.0, abs=1e-7)
    # trainer = behaviour − 0.5: |Δ| = 0.5, log-ratio (trainer − behaviour) = −0.5.
    assert b.mult_error_sum == pytest.approx(tokens[1] * math.exp(0.5), rel=1e-5)
    assert b.gen_kl_sum == pytest.approx(tokens[1] * (math.exp(-0.5) - 1 + 0.5), rel=1e-5)


def test_a_disagreeing_worker_is_flagged_and_only_its_groups_are_dropped() -> None:
    trust = WorkerTrust(WorkerTrustConfig(enabled=True, min_tokens=1))
    groups = [group("honest", "w-a", "w-a"), group("bad", "w-b", "w-b")]
    _, agreements = measure(groups, {"w-a": 0.0, "w-b": 1.0})  # exp(1) = 2.7 > 1.1
    drops = trust.judge(groups, agreements)
    assert drops == {"bad": "untrusted_worker:w-b"}
    assert trust.workers["w-b"].flagged and not trust.workers["w-a"].flagged
    detail = trust.detail(drops["bad"])
    assert "w-b" in detail and "token_mult_prob_error 2.718 > 1.1" in detail
    metrics = trust.metrics()
    assert metrics["workers/w-b/flagged"] == 1.0 and metrics["workers/flagged"] == 1.0
    assert metrics["workers/w-b/token_mult_prob_error"] == pytest.approx(math.e, rel=1e-5)


def test_a_group_with_any_sample_from_a_flagged_worker_is_dropped() -> None:
    trust = WorkerTrust(WorkerTrustConfig(enabled=True, min_tokens=1))
    groups = [group("mixed", "w-a", "w-b")]
    _, agreements = measure(groups, {"w-a": 0.0, "w-b": 1.0})
    assert trust.judge(groups, agreements) == {"mixed": "untrusted_worker:w-b"}


def test_the_kl_limit_alone_flags_a_worker() -> None:
    # |Δ| = 0.08: exp(0.08) = 1.083 ≤ 1.1, but KL with log-ratio +0.08 (the trainer finds the
    # tokens likelier): exp(0.08) − 1 − 0.08 = 0.0033 > 0.002.
    trust = WorkerTrust(WorkerTrustConfig(enabled=True, min_tokens=1, max_gen_kl=0.002))
    groups = [group("g", "w-a")]
    _, agreements = measure(groups, {"w-a": -0.08})
    assert trust.judge(groups, agreements) == {"g": "untrusted_worker:w-a"}
    assert "gen_kl" in trust.detail("untrusted_worker:w-a")


def test_a_worker_is_judged_only_once_it_has_min_tokens() -> None:
    groups = [group("g0", "w-b")]
    _, agreements = measure(groups, {"w-b": 1.0})
    enough = agreements[0].tokens
    assert WorkerTrust(WorkerTrustConfig(min_tokens=enough + 1)).judge(groups, agreements) == {}
    assert WorkerTrust(WorkerTrustConfig(min_tokens=enough)).judge(groups, agreements) == {
        "g0": "untrusted_worker:w-b"
    }


def test_a_fixed_worker_is_cleared_once_its_recent_samples_agree() -> None:
    trust = WorkerTrust(WorkerTrustConfig(enabled=True, min_tokens=1, window_samples=2))
    bad = [group("bad", "w-b", "w-b")]
    assert trust.judge(bad, measure(bad, {"w-b": 1.0})[1]) == {"bad": "untrusted_worker:w-b"}
    # Refitted: its next two samples agree, and fill the window of two.
    good = [group("good", "w-b", "w-b")]
    assert trust.judge(good, measure(good, {"w-b": 0.0})[1]) == {}
    assert not trust.workers["w-b"].flagged


def test_agreements_must_match_the_groups_samples() -> None:
    trust = WorkerTrust(WorkerTrustConfig())
    groups = [group("g", "w-a")]
    _, agreements = measure([*groups, group("h", "w-a")], {"w-a": 0.0})
    with pytest.raises(ValueError, match="more sample agreements"):
        trust.judge(groups, agreements)
