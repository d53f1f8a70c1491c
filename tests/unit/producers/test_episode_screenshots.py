"""Episodes that show screenshots: a real desktop simulator (``dockyard osworld serve``), the real
torch engine (pixel values, M-RoPE positions) running a scripted policy (stand-in, named as
such: see scripted_policy.py), Qwen2-VL's tokenizer, chat template and image processor (the tiny
VLM's, built in code).

The episode's images are its desktop's first screenshot then one per action, each compared with
the simulator's rendering of the same state made here; the token sequence holds one expanded
placeholder run per image, in the same order, inside the prompt and the tool segments.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dockyard.config.sections.env import EnvConfig, OsworldEnvConfig
from dockyard.data.tool_turns import TemplatedObservations
from dockyard.engines.base import GenerationEngine, GenerationRequest, SamplingParams
from dockyard.environments.osworld.actions import parse_actions
from dockyard.environments.osworld.desktop import Desktop
from dockyard.environments.osworld.tasks import parse_task
from dockyard.models.tiny_vlm import (
    QWEN2_VL_CHAT_TEMPLATE,
    build_qwen2_vl_processor,
    build_qwen2_vl_tokenizer,
)
from dockyard.models.vision import placeholder_runs
from dockyard.producers.episode_images import EpisodeImages
from dockyard.producers.episodes import EpisodeRunner, EpisodeSettings
from dockyard.producers.multimodal import MultimodalLimits
from dockyard.producers.rollout_assembly import build_episode_rollout
from dockyard.schemas import DatasetPosition, EngineInfo, FinishReason, PromptGroup, Rollout
from dockyard.schemas.codec import decode, encode
from tests.osworld_simulator import simulator_command
from tests.sandbox_service import sandbox_service
from tests.unit.producers.scripted_policy import scripted_vision_engine

DATA = Path(__file__).resolve().parents[3] / "configs" / "cpu" / "data"
RECORD = json.loads((DATA / "osworld_screenshot.jsonl").read_text().splitlines()[0])
CLICK, WRITE = "pyautogui.click(20, 20)", "pyautogui.write('Ada')"
# Qwen2-VL's smart_resize of a 320x200 screen under the tiny processor's max_pixels (16 merged
# patches of 28x28): scale sqrt(320·200 / 12544) ≈ 2.259, so floor(200/2.259/28)·28 = 84 by
# floor(320/2.259/28)·28 = 140 pixels, (84/28)·(140/28) = 3·5 = 15 merged patches.
TOKENS_PER_SCREENSHOT = 15


def computer(action: str) -> str:
    call = {"name": "computer", "arguments": {"action": action}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def rendered(*codes: str) -> bytes:
    """The task's screen after ``codes``, rendered here from its spec (not by the service)."""
    desktop = Desktop.from_spec(parse_task(RECORD["task"]).desktop)
    for code in codes:
        for action in parse_actions(code):
            desktop.apply(action)
    return desktop.screenshot()


def pixels(image: Image.Image | bytes) -> bytes:
    if isinstance(image, bytes):
        with Image.open(io.BytesIO(image)) as opened:
            return opened.convert("RGB").tobytes()
    return image.convert("RGB").tobytes()


class Recording:
    """The real engine, with every request it was given kept (what each turn was shown)."""

    def __init__(self, engine: GenerationEngine) -> None:
        self.engine = engine
        self.requests: list[GenerationRequest] = []

    @property
    def backend(self) -> str:
        return self.engine.backend

    @property
    def current_version(self) -> int:
        return self.engine.current_version

    async def generate(self, requests, params, num_samples):
        self.requests.extend(requests)
        return await self.engine.generate(requests, params, num_samples)

    def __getattr__(self, name: str):
        return getattr(self.engine, name)


@pytest.fixture(scope="module")
def simulator_url() -> Iterator[str]:
    with sandbox_service(simulator_command()) as url:
        yield url


def chat_script(turns: Sequence[str]) -> list[str]:
    """The scripted policy writes turn k when its context holds k EOS tokens; in Qwen2-VL's
    chat the prompt holds two <|im_end|> (system, user) and each round adds two (the model's
    turn, the tool message), so turn i is written at 2 + 2i (the others are never reached)."""
    script = [""] * (2 + 2 * len(turns))
    for index, turn in enumerate(turns):
        script[2 + 2 * index] = turn
    return script


def run_episode(simulator_url: str, turns: Sequence[str], max_images: int = 8, budget: int = 2048):
    """One episode of the screenshot task's group, as a rollout worker runs it: the group's
    sessions opened (each shown its desktop's first screenshot), run, and its rollout built."""
    tok = build_qwen2_vl_tokenizer()
    processor = build_qwen2_vl_processor(tok)
    engine = scripted_vision_engine(chat_script(turns), processor)
    recording = Recording(engine)
    settings = EpisodeSettings(
        max_turns=4,
        tool_call_format="hermes",
        max_tool_calls_per_turn=1,
        max_total_sequence_length=budget,
    )
    limits = MultimodalLimits(allow_multimodal_inputs=True, max_images_per_sample=max_images)
    osworld = OsworldEnvConfig(simulator_url=simulator_url, observation_type="screenshot")
    runner = EpisodeRunner(
        recording,
        SamplingParams(max_new_tokens=128),
        settings,
        tok,
        EnvConfig(osworld=osworld),
        TemplatedObservations(tok, QWEN2_VL_CHAT_TEMPLATE),
        EpisodeImages(limits, engine.backend, engine.accepts_images, processor),
    )
    prompt_text = tok.apply_chat_template(
        RECORD["messages"],
        chat_template=QWEN2_VL_CHAT_TEMPLATE,
        add_generation_prompt=True,
        tokenize=False,
    )
    group = PromptGroup(
        group_id="g0",
        prompt_token_ids=np.asarray(tok.encode(prompt_text, add_special_tokens=False), np.int32),
        prompt_text=prompt_text,
        environment="osworld",
        agent="test",
        num_generations=1,
        dataset_position=DatasetPosition(dataset="d", epoch=0, index=0),
        extra={"task": RECORD["task"]},
        dispatch_weight_version=0,
        trace_id="g0",
    )

    async def episodes():
        starts = await runner.open_group(group, [], delivery=1)
        try:
            return await runner.run(starts)
        finally:
            await runner.close(starts)
            await runner.aclose()

    [episode] = asyncio.run(episodes())
    rollout = build_episode_rollout(
        group,
        [episode],
        runner.params,
        engine=EngineInfo(name="torch", version="test"),
        worker_id="w0",
        started_at_unix_s=0.0,
    )
    return episode, recording, processor, rollout


def test_two_actions_show_three_screenshots_in_placeholder_order(simulator_url):
    episode, recording, processor, rollout = run_episode(
        simulator_url, [computer(CLICK), computer(WRITE), "Typed."]
    )
    assert episode.finish_reason is FinishReason.STOP
    assert [pixels(image) for image in episode.images] == [
        pixels(rendered()),
        pixels(rendered(CLICK)),
        pixels(rendered(CLICK, WRITE)),
    ]
    prompt = list(episode.start.prompt_token_ids)
    context = prompt + episode.token_ids
    runs = placeholder_runs(context, processor.image_token_id)
    assert [length for _, length in runs] == [TOKENS_PER_SCREENSHOT] * 3
    # The first in the prompt, then one in each tool segment (masked, log-prob 0).
    first, *observed = runs
    assert first[0] + first[1] <= len(prompt)
    tools = [s for s in episode.segments if s.role == "tool"]
    assert len(tools) == 2
    for (start, length), segment in zip(observed, tools, strict=True):
        start -= len(prompt)
        assert segment.start <= start and start + length <= segment.end
        assert episode.loss_mask[start : start + length] == [0] * length
        assert episode.logprobs[start : start + length] == [0.0] * length
    # Every turn's request showed every image the episode had shown so far, in order.
    shown = [[pixels(image) for image in request.images] for request in recording.requests]
    assert shown == [
        [pixels(rendered())],
        [pixels(rendered()), pixels(rendered(CLICK))],
        [pixels(rendered()), pixels(rendered(CLICK)), pixels(rendered(CLICK, WRITE))],
    ]
    for request in recording.requests:
        request_runs = placeholder_runs(request.prompt_token_ids, processor.image_token_id)
        assert len(request_runs) == len(request.images)
    # On the wire: the sample's own (expanded) prompt and its images as PNG files, in order.
    encoded = encode(rollout)
    [sample] = decode(encoded.headers, encoded.payload, expected=Rollout).samples
    assert sample.prompt_token_ids.tolist() == prompt
    assert [pixels(png) for png in sample.images] == [
        pixels(rendered()),
        pixels(rendered(CLICK)),
        pixels(rendered(CLICK, WRITE)),
    ]


def test_a_screenshot_past_max_images_per_sample_ends_the_episode_with_the_reason(simulator_url):
    episode, _, processor, _ = run_episode(
        simulator_url, [computer(CLICK), computer(WRITE), "Typed."], max_images=2
    )
    # The first screenshot and the click's fit; the write's would be the third.
    assert episode.finish_reason is FinishReason.LENGTH
    assert episode.ended_by is not None and "too_many_images" in episode.ended_by
    assert [pixels(image) for image in episode.images] == [
        pixels(rendered()),
        pixels(rendered(CLICK)),
    ]
    assert [s.role for s in episode.segments] == ["assistant", "tool", "assistant"]
    assert len(episode.tool_calls) == 2  # the write ran and is recorded; its screen not shown
    context = list(episode.start.prompt_token_ids) + episode.token_ids
    assert len(placeholder_runs(context, processor.image_token_id)) == 2


def test_a_budget_cut_inside_a_screenshot_keeps_no_part_of_it(simulator_url):
    turns = [computer(CLICK), "Clicked."]
    whole, _, processor, _ = run_episode(simulator_url, turns)
    prompt = len(whole.start.prompt_token_ids)
    runs = placeholder_runs(
        [*whole.start.prompt_token_ids, *whole.token_ids], processor.image_token_id
    )
    start, length = runs[1]  # the click's screenshot, in the first tool segment
    # The budget ends five tokens into that run: the run and its image are left out whole.
    cut, _, _, _ = run_episode(simulator_url, turns, budget=start + 5)
    assert cut.finish_reason is FinishReason.LENGTH
    assert len(cut.images) == 1  # the first screen only
    assert cut.token_ids == whole.token_ids[: start - prompt]
    context = [*cut.start.prompt_token_ids, *cut.token_ids]
    assert len(placeholder_runs(context, processor.image_token_id)) == 1
    assert length == TOKENS_PER_SCREENSHOT
