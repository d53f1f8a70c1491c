"""The trainer's validation with structured tool use: each held-out prompt answered by a greedy
episode (real sandboxed terminal toolbox, real TorchEngine over a scripted policy — the stand-in
named in tests/unit/producers/scripted_policy.py), scored from the episode's tool calls."""

from __future__ import annotations

from pathlib import Path

from dockyard.commands._roles import validation_episodes
from dockyard.config.loader import load_config
from dockyard.config.sections.data import DatasetConfig, FieldMapping
from dockyard.config.sections.env import SandboxLimits, TerminalBenchEnvConfig
from dockyard.consumers.trainer.evaluation import Evaluator
from dockyard.data.catalog import build_dataset
from dockyard.engines.base import SamplingParams
from dockyard.environments import EnvironmentContext, build_environment
from dockyard.producers.episodes import EpisodeRunner, EpisodeSettings
from tests.unit.producers.scripted_policy import scripted_engine

DATA = Path(__file__).resolve().parents[3] / "configs" / "cpu" / "data" / "terminal_bench.jsonl"
FIELDS = FieldMapping(prompt="instruction", answer="solution", metadata=["setup", "check"])
BASH = '<tool_call>{"name": "bash", "arguments": {"command": "echo hello > hello.txt"}}</tool_call>'
SETTINGS = TerminalBenchEnvConfig(limits=SandboxLimits(wall_time_s=5.0))


async def test_validation_answers_with_episodes_scored_from_their_tool_calls():
    # The policy, whatever the task, writes hello.txt with the tool, then says it is done:
    # that solves tb-1 (hello.txt) and none of the three others (setup files, counts).
    engine, tok = scripted_engine([BASH, "Done."])
    dataset = build_dataset(
        DatasetConfig(name="terminal_bench", path=str(DATA), fields=FIELDS), "terminal_bench"
    )
    context = EnvironmentContext()
    context.env.terminal_bench = SETTINGS

    def episodes(engine, params):
        settings = EpisodeSettings(2, "hermes", 1, 1024)
        return EpisodeRunner(engine, params, settings, tok, context.env)

    evaluator = Evaluator(
        engine.model,
        tok,
        dataset,
        build_environment("terminal_bench", context),
        max_new_tokens=256,
        episodes=episodes,
    )
    result = await evaluator.evaluate()
    assert [s.reward for s in result.samples] == [1.0, 0.0, 0.0, 0.0]
    assert result.accuracy == 0.25
    assert result.samples[0].response.startswith(BASH)  # the episode's turns, as the model saw


def test_the_trainer_validates_with_episodes_exactly_with_structured_tool_use():
    # The CPU preset runs multi-turn; without tool use it validates single-turn.
    single = ["grpo.structured_tool_use.enabled=false", "grpo.max_rollout_turns=1"]
    plain = load_config("configs/cpu/grpo_terminal_bench.yaml", single)
    assert validation_episodes(plain, plane=None) is None  # type: ignore[arg-type]
    tools = ["grpo.structured_tool_use.enabled=true", "grpo.max_rollout_turns=3"]
    config = load_config("configs/cpu/grpo_terminal_bench.yaml", tools)
    factory = validation_episodes(config, plane=None)  # type: ignore[arg-type]
    assert factory is not None
    engine, _ = scripted_engine([])
    params = SamplingParams(max_new_tokens=8)
    runner = factory(engine, params)
    assert runner.settings.max_turns == 3 and runner.params is params
