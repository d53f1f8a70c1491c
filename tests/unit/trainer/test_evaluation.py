"""Validation: the greedy answers behind the accuracy, and the ones printed to the log."""

from __future__ import annotations

import json

from structlog.testing import capture_logs

from dockyard.config.sections.data import DatasetConfig
from dockyard.consumers.trainer.evaluation import (
    MAX_PRINTED_CHARS,
    EvalResult,
    Evaluator,
    ValSample,
    log_val_samples,
)
from dockyard.data.catalog import build_dataset
from dockyard.environments.registry import build_environment
from dockyard.models import build_arithmetic_policy


def validation_set(num_samples: int):
    return build_dataset(
        DatasetConfig(
            name="arithmetic",
            split="validation",
            params={"low": 10, "high": 99, "num_samples": num_samples, "seed": 2},
        ),
        "arithmetic",
    )


async def test_the_result_keeps_each_answer_with_the_reward_it_got():
    model, tokenizer = build_arithmetic_policy(seed=0)
    dataset = validation_set(5)
    evaluator = Evaluator(
        model, tokenizer, dataset, build_environment("arithmetic"), max_new_tokens=4
    )
    result = await evaluator.evaluate()

    assert [s.prompt for s in result.samples] == [dataset[i].prompt for i in range(5)]
    assert [s.ground_truth for s in result.samples] == [dataset[i].ground_truth for i in range(5)]
    assert all(s.response for s in result.samples)  # greedy answers of an untrained policy
    correct = sum(s.reward >= 1.0 for s in result.samples)
    assert result.accuracy == correct / 5
    assert result.mean_reward == sum(s.reward for s in result.samples) / 5


def test_printed_samples_are_one_event_each_with_long_texts_cut_from_the_front():
    long_answer = "x" * (3 * MAX_PRINTED_CHARS) + "=42"
    samples = [
        ValSample(prompt="12+30=", response="42", ground_truth="42", reward=1.0),
        ValSample(prompt="1+1=", response=long_answer, ground_truth="2", reward=0.0),
    ]
    with capture_logs() as events:
        log_val_samples(samples, step=7)

    printed = [e for e in events if e["event"] == "validation.sample"]
    assert [(e["step"], e["index"], e["reward"]) for e in printed] == [(7, 0, 1.0), (7, 1, 0.0)]
    assert printed[0]["prompt"] == "12+30=" and printed[0]["response"] == "42"
    assert printed[0]["ground_truth"] == "42"
    cut = printed[1]["response"]
    marker = f"[{2 * MAX_PRINTED_CHARS + 3} chars cut]…"
    assert cut == marker + long_answer[-MAX_PRINTED_CHARS:]


async def test_val_batch_size_bounds_each_generation_batch_and_changes_no_answer():
    # grpo.val_batch_size = 3 over 7 prompts: the engine sees batches of 3, 3 and 1, and the
    # greedy answers are the ones a single batch of 7 gives.
    model, tokenizer = build_arithmetic_policy(seed=0)
    dataset = validation_set(7)
    environment = build_environment("arithmetic")
    whole = await Evaluator(model, tokenizer, dataset, environment, max_new_tokens=4).evaluate()
    batched = Evaluator(model, tokenizer, dataset, environment, max_new_tokens=4, batch_size=3)
    sizes: list[int] = []
    generate = batched.engine.generate

    async def recording_generate(requests, params, num_samples):
        sizes.append(len(requests))
        return await generate(requests, params, num_samples)

    batched.engine.generate = recording_generate  # type: ignore[method-assign]
    result = await batched.evaluate()
    assert sizes == [3, 3, 1]
    assert [s.response for s in result.samples] == [s.response for s in whole.samples]
    assert result.accuracy == whole.accuracy


def test_a_mixture_is_also_scored_per_agent():
    # adder: 3 of 4 correct, one half-credit answer; reverser: none of 2 correct.
    rewards = {"adder": [1.0, 0.0, 1.0, 1.0], "reverser": [0.0, 0.5]}
    samples = tuple(
        ValSample(prompt="p", response="r", ground_truth="g", reward=reward, agent=agent)
        for agent, values in rewards.items()
        for reward in values
    )
    result = EvalResult(
        accuracy=3 / 6, mean_reward=3.5 / 6, num_samples=6, seconds=0.1, samples=samples
    )
    metrics = result.as_metrics()

    assert metrics["val/accuracy"] == 3 / 6
    assert metrics["val/accuracy/adder"] == 3 / 4
    assert metrics["val/mean_reward/adder"] == 3 / 4
    assert metrics["val/accuracy/reverser"] == 0.0
    assert metrics["val/mean_reward/reverser"] == 0.25


def test_one_agent_logs_only_the_overall_numbers():
    samples = (ValSample("p", "r", "g", 1.0, agent="adder"),) * 2
    metrics = EvalResult(1.0, 1.0, 2, 0.1, samples).as_metrics()
    assert not [key for key in metrics if key.startswith(("val/accuracy/", "val/mean_reward/"))]


async def test_the_evaluator_scores_each_record_under_its_own_agent(tmp_path):
    # A hand-built mixture file: the "reverser" rows' answers need 8 digits, which 4 new tokens
    # (one character each in this vocabulary) cannot write, so that agent scores exactly 0;
    # the "adder" rows are real sums the untrained policy may or may not get.
    adder = [
        {"prompt": f"{10 + i}+{20 + i}=", "answer": str(30 + 2 * i), "domain": "adder"}
        for i in range(4)
    ]
    reverser = [
        {"prompt": f"{i}+{i}=", "answer": "12345678", "domain": "reverser"} for i in range(3)
    ]
    path = tmp_path / "mix.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in [*adder, *reverser]))
    dataset = build_dataset(
        DatasetConfig(name="mix", path=str(path), fields={"agent": "domain"}), "arithmetic"
    )
    model, tokenizer = build_arithmetic_policy(seed=0)
    evaluator = Evaluator(
        model, tokenizer, dataset, build_environment("arithmetic"), max_new_tokens=4
    )
    result = await evaluator.evaluate()
    metrics = result.as_metrics()

    assert [s.agent for s in result.samples] == ["adder"] * 4 + ["reverser"] * 3
    assert metrics["val/accuracy/reverser"] == 0.0
    assert metrics["val/mean_reward/reverser"] == 0.0
    adder_rewards = [s.reward for s in result.samples[:4]]
    assert metrics["val/accuracy/adder"] == sum(r >= 1.0 for r in adder_rewards) / 4
    # The per-agent accuracies, weighted by their counts, make the overall one.
    assert metrics["val/accuracy"] == 4 * metrics["val/accuracy/adder"] / 7
