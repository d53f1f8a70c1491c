"""Does multi-turn GRPO teach a tiny model to use a tool? configs/multiturn_tools.yaml, two arms.

- ``tool``: episodes of up to ``grpo.max_rollout_turns`` turns; the model may call the
  calculator (Hermes format), reads its observation, answers.
- ``no_tool``: the same model, warm start and GRPO, one turn: it must multiply in its head.

Each arm: the tiny model built in code, an SFT warm start on demonstrations (tool arm: the call,
the observation masked out of the loss, the answer; baseline: the answer) until greedy held-out
accuracy reaches ``sft.stop_at_val_accuracy`` or ``sft.max_num_steps``, then
``grpo.max_num_steps`` GRPO steps. Real parts throughout: the TorchEngine generating, the
EpisodeRunner and the calculator toolbox, the rollout and scored-rollout messages, the trainer's
batch and step, refits of the engine by state dict after each step. Not here: the broker (one
process, synchronous: generation with the weights of the step before, as ``async_grpo`` off).

Reward: 1 when the final turn is the exact product before EOS (the arithmetic environment's
scoring), else 0. Accuracy: greedy, on ``data.validation`` (held-out pairs).

    PYTHONPATH=. python benchmarks/bench_multiturn_tools.py [--steps N] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import random
import time
from dataclasses import asdict, dataclass, replace
from datetime import date
from pathlib import Path

import numpy as np
import torch
from report import replace_section

from dockyard.config.loader import load_config
from dockyard.config.sections.env import ArithmeticEnvConfig
from dockyard.consumers.trainer.batch import build_batch
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.consumers.trainer.sft import sft_batch
from dockyard.data.base import PromptRecord
from dockyard.data.catalog import build_dataset
from dockyard.data.demonstrations import ToolDemonstrations
from dockyard.engines.base import SamplingParams
from dockyard.engines.torch_engine import TorchEngine
from dockyard.environments.arithmetic_env import score_arithmetic_sample
from dockyard.environments.base import SampleInput
from dockyard.environments.tools.calculator import CalculatorToolbox
from dockyard.models import load_policy
from dockyard.producers.episodes import (
    Episode,
    EpisodeRunner,
    EpisodeSettings,
    EpisodeStart,
)
from dockyard.producers.rollout_assembly import build_episode_rollout
from dockyard.schemas import (
    DatasetPosition,
    EngineInfo,
    FinishReason,
    PromptGroup,
    SampleScore,
    ScoredRollout,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "multiturn_tools.yaml"
#: Held-out prompts the warm start's stop check reads (greedy).
EVAL_PROMPTS = 50
ENGINE = EngineInfo(name="torch", version="bench")


@dataclass
class Arm:
    name: str
    turns: int
    sft_steps: int = 0
    sft_accuracy: float = 0.0
    curve: list[tuple[int, float, float, float]] | None = None  # step, val acc, reward, calls
    seconds: float = 0.0


def demonstration(record: PromptRecord, tok, with_tool: bool) -> tuple[list[int], list[int]]:
    """The continuation to imitate and its loss mask: the record's demonstrated episode, as the
    trainer's warm start builds it (0 on the observation), or the answer alone."""
    if with_tool:
        continuation = ToolDemonstrations(tok, "hermes")(record)
        return continuation.token_ids, continuation.loss_mask
    answer = [*tok.encode(record.ground_truth, add_special_tokens=False), tok.eos_token_id]
    return answer, [1] * len(answer)


def final_reward(episode: Episode, tok, truth: str) -> float:
    """The arithmetic environment's score of the episode's last model turn."""
    if episode.finish_reason is not FinishReason.STOP:
        return 0.0
    last = next(s for s in reversed(episode.segments) if s.role == "assistant")
    text = tok.decode(episode.token_ids[last.start : last.end], skip_special_tokens=True)
    sample = SampleInput(response_text=text, finish_reason="stop")
    return score_arithmetic_sample(sample, int(truth), ArithmeticEnvConfig()).reward


async def run_episodes(runner: EpisodeRunner, tok, records, generations: int) -> list[Episode]:
    toolbox = CalculatorToolbox()
    starts = [
        EpisodeStart(
            f"{record.index}:{g}",
            tok(record.prompt)["input_ids"],
            await toolbox.open_session(f"{record.index}:{g}"),
        )
        for record in records
        for g in range(generations)
    ]
    return await runner.run(starts)


def accuracy(runner: EpisodeRunner, tok, records) -> float:
    episodes = asyncio.run(run_episodes(runner, tok, records, 1))
    rewards = [final_reward(e, tok, r.ground_truth) for e, r in zip(episodes, records, strict=True)]
    return float(np.mean(rewards))


def refit(engine: TorchEngine, model: torch.nn.Module) -> None:
    """The engine takes the trained weights as a rollout worker does (a new version)."""
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    asyncio.run(engine.update_weights(engine.current_version + 1, state))


def warm_start(
    model, tok, config, records, evaluation, runner, with_tool: bool, rng
) -> tuple[int, float]:
    sft = config.sft
    optimizer = torch.optim.AdamW(model.parameters(), lr=sft.lr, weight_decay=0.0)
    step, acc = 0, 0.0
    for step in range(1, sft.max_num_steps + 1):
        batch = [rng.choice(records) for _ in range(sft.batch_size)]
        prompts = [tok(r.prompt)["input_ids"] for r in batch]
        shown = [demonstration(r, tok, with_tool) for r in batch]
        input_ids, attention, target = sft_batch(
            prompts, [tokens for tokens, _ in shown], tok.pad_token_id, "answer"
        )
        for row, (prompt, (_, mask)) in enumerate(zip(prompts, shown, strict=True)):
            start = len(prompt) - 1
            target[row, start : start + len(mask)] = torch.tensor(mask, dtype=target.dtype)
        model.train()
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
        losses = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), input_ids[:, 1:], reduction="none"
        )
        loss = (losses * target).sum() / target.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % sft.val_period == 0:
            refit(runner.engine, model)
            acc = accuracy(runner, tok, evaluation)
            print(f"sft step {step:3d}  held-out accuracy {acc:.3f}", flush=True)
            if sft.stop_at_val_accuracy is not None and acc >= sft.stop_at_val_accuracy:
                break
    return step, acc


def group_of(record: PromptRecord, tok, generations: int, index: int) -> PromptGroup:
    return PromptGroup(
        group_id=f"g{index}",
        prompt_token_ids=np.asarray(tok(record.prompt)["input_ids"], dtype=np.int32),
        prompt_text=record.prompt,
        environment="calculator",
        agent="bench",
        num_generations=generations,
        dataset_position=DatasetPosition(dataset="arithmetic", epoch=0, index=record.index),
        ground_truth=record.ground_truth,
        dispatch_weight_version=0,
        trace_id=f"g{index}",
    )


def train_arm(arm: Arm, config, steps: int, eval_every: int) -> Arm:
    torch.manual_seed(0)
    rng = random.Random(0)
    started = time.perf_counter()
    model, tok = load_policy(config.policy.model_name)
    train = build_dataset(config.data.train, "arithmetic")
    validation = build_dataset(config.data.validation, "arithmetic")
    records = [train[i] for i in range(len(train))]
    held_out = [validation[i] for i in range(len(validation))]
    settings = replace(
        EpisodeSettings.from_config(config.grpo, config.policy.max_total_sequence_length),
        max_turns=arm.turns,
    )
    engine = TorchEngine(
        copy.deepcopy(model), eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id
    )
    max_new = config.policy.generation.max_new_tokens
    greedy = EpisodeRunner(engine, SamplingParams(max_new, temperature=0.0), settings, tok)
    sampled = EpisodeRunner(engine, SamplingParams(max_new, temperature=1.0, seed=0), settings, tok)
    arm.sft_steps, arm.sft_accuracy = warm_start(
        model, tok, config, records, held_out[:EVAL_PROMPTS], greedy, arm.turns > 1, rng
    )
    trainer = PolicyTrainer(model, config)
    refit(engine, trainer.model)
    generations = config.grpo.num_generations_per_prompt
    arm.curve = []
    for step in range(steps + 1):
        if step % eval_every == 0 or step == steps:
            val = accuracy(greedy, tok, held_out[: config.grpo.max_val_samples])
        if step == steps:
            arm.curve.append((step, val, float("nan"), float("nan")))
            break
        chosen = [rng.choice(records) for _ in range(config.grpo.num_prompts_per_step)]
        episodes = asyncio.run(run_episodes(sampled, tok, chosen, generations))
        groups, rewards, calls = [], [], []
        for index, record in enumerate(chosen):
            mine = episodes[index * generations : (index + 1) * generations]
            rollout = build_episode_rollout(
                group_of(record, tok, generations, index),
                mine,
                sampled.params,
                engine=ENGINE,
                worker_id="bench",
                started_at_unix_s=0.0,
            )
            scores = [final_reward(e, tok, record.ground_truth) for e in mine]
            rewards += scores
            calls += [bool(e.tool_calls) for e in mine]
            groups.append(
                ScoredRollout(
                    rollout=rollout,
                    scores=[SampleScore(sample_index=i, reward=r) for i, r in enumerate(scores)],
                    scorer_id="bench",
                )
            )
        trainer.step(build_batch(groups, tok.pad_token_id))
        refit(engine, trainer.model)
        if step % eval_every == 0:
            arm.curve.append((step, val, float(np.mean(rewards)), float(np.mean(calls))))
            print(
                f"{arm.name:8s} step {step:3d}  val {val:.3f}  reward {np.mean(rewards):.3f}"
                f"  tool calls {np.mean(calls):.2f}",
                flush=True,
            )
    arm.seconds = time.perf_counter() - started
    return arm


def report(arms: list[Arm], steps: int, overrides: list[str]) -> str:
    tool, baseline = arms
    lines = [
        f"Measured {date.today().isoformat()} on this machine (2 shared CPU cores), "
        f"`PYTHONPATH=. python benchmarks/bench_multiturn_tools.py --steps {steps} "
        f"{' '.join(overrides)}` (each arm its own process): "
        "configs/multiturn_tools.yaml, greedy accuracy on held-out `a*b=` problems "
        "(10 ≤ a, b ≤ 99); reward and tool-call rate are the GRPO step's sampled episodes.",
        "",
        "| arm | SFT steps (acc. after) | GRPO step | held-out acc. | mean reward | tool calls |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for arm in arms:
        for step, val, reward, calls in [tuple(point) for point in arm.curve or []]:
            shown = (
                "—" if np.isnan(reward) else f"{reward:.3f}",
                "—" if np.isnan(calls) else f"{calls:.2f}",
            )
            lines.append(
                f"| {arm.name} | {arm.sft_steps} ({arm.sft_accuracy:.2f}) | {step} | {val:.3f} "
                f"| {shown[0]} | {shown[1]} |"
            )
    final_tool, final_base = tool.curve[-1][1], baseline.curve[-1][1]  # type: ignore[index]
    start_tool = tool.curve[0][1]  # type: ignore[index]
    lines += [
        "",
        f"Tool arm: {start_tool:.3f} → {final_tool:.3f} held-out accuracy over {steps} GRPO "
        f"steps ({tool.seconds:.0f} s with warm start); baseline without the tool: "
        f"{final_base:.3f} ({baseline.seconds:.0f} s). Ratio tool / no tool at the end: "
        + (f"{final_tool / final_base:.1f}×." if final_base > 0 else "baseline at 0."),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="default: grpo.max_num_steps")
    parser.add_argument("--eval-every", type=int, default=None, help="default: grpo.val_period")
    parser.add_argument(
        "--arm", choices=("tool", "no_tool"), default=None, help="run one arm (default: both)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the arm(s) run here")
    parser.add_argument(
        "--report", type=Path, nargs="+", default=None, help="report arms written by --json"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads per process")
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(CONFIG, args.overrides)
    steps = args.steps or config.grpo.max_num_steps
    eval_every = args.eval_every or config.grpo.val_period
    if args.report:
        arms = [Arm(**arm) for path in args.report for arm in json.loads(path.read_text())]
    else:
        chosen = [args.arm] if args.arm else ["tool", "no_tool"]
        turns = {"tool": config.grpo.max_rollout_turns, "no_tool": 1}
        arms = [train_arm(Arm(name, turns[name]), config, steps, eval_every) for name in chosen]
        if args.json:
            args.json.write_text(json.dumps([asdict(arm) for arm in arms]))
    if len(arms) == 2:
        arms.sort(key=lambda arm: arm.name != "tool")
        text = report(arms, steps, args.overrides)
        print(text)
        if args.write_docs:
            heading = ["## Multi-turn tool use (learning demo)", ""]
            replace_section("multiturn-tools", heading + text.splitlines())


if __name__ == "__main__":
    main()
