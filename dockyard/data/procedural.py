"""Procedural datasets from ``reasoning-gym``: ``data.*.name: reasoning_gym/<task>``.

Each of reasoning-gym's task families generates its items from a seed (nothing is downloaded)
and ships its own verifier; the ``reasoning_gym`` environment scores with it. ``params`` go to
the task's config (``reasoning_gym.create_dataset(task, seed=..., size=..., **params)``);
``params.size`` (or ``max_samples``) is the number of items, ``params.seed`` the seed (default
0). A validation split draws with another seed, so its items are other draws of the generator
(a task with a small item space can repeat a training item; reasoning-gym has no partition).

The whole item (question, answer, metadata) travels to the scorer in ``extra`` as JSON, because
the verifier reads the metadata; :func:`encode_entry` keeps the tuples and non-string keys JSON
would lose, so the scorer's verifier sees the item the generator made.
"""

from __future__ import annotations

import difflib
import json

from dockyard.config.sections.data import DatasetConfig
from dockyard.data.base import DatasetError, PromptRecord, UnknownDatasetError, register_dataset

FAMILY = "reasoning_gym"
ENTRY_KEY = "reasoning_gym_entry"
# The task and its generator config: the scorer builds the same dataset object, so a verifier
# that reads its config (not only the item) judges as the generator intended.
TASK_KEY = "reasoning_gym_task"
CONFIG_KEY = "reasoning_gym_config"
DEFAULT_SIZE = 1000
VALIDATION_SPLITS = ("validation", "val", "test", "dev")
# Far from any seed a user picks for training, so validation draws other items.
_VALIDATION_SEED_OFFSET = 1_000_003

_TUPLE, _PAIRS = "__tuple__", "__pairs__"


def encode_entry(value: object) -> object:
    if isinstance(value, tuple):
        return {_TUPLE: [encode_entry(v) for v in value]}
    if isinstance(value, list):
        return [encode_entry(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(key, str) for key in value):
            return {key: encode_entry(v) for key, v in value.items()}
        return {_PAIRS: [[encode_entry(k), encode_entry(v)] for k, v in value.items()]}
    return value


def decode_entry(value: object) -> object:
    if isinstance(value, list):
        return [decode_entry(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {_TUPLE}:
            return tuple(decode_entry(v) for v in value[_TUPLE])
        if set(value) == {_PAIRS}:
            return {_hashable(decode_entry(k)): decode_entry(v) for k, v in value[_PAIRS]}
        return {key: decode_entry(v) for key, v in value.items()}
    return value


def _hashable(key: object) -> object:
    return tuple(key) if isinstance(key, list) else key


def task_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


class ProceduralDataset:
    """Items are generated when read (reasoning-gym's datasets are lazy and deterministic)."""

    def __init__(
        self, name: str, task: str, options: dict[str, object], items: object, env: str
    ) -> None:
        self.name = name
        self.task = task
        self._options = json.dumps(options, sort_keys=True)
        self._items = items
        size = options["size"]
        assert isinstance(size, int), "build_procedural stores the item count as an int"
        self._size = size
        self.env = env

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int) -> PromptRecord:
        entry = self._items[index]  # type: ignore[index]  # reasoning-gym's dataset: indexable, untyped
        answer = entry["answer"]
        return PromptRecord(
            index=index,
            prompt=entry["question"],
            # Some tasks (puzzles with many solutions) have no reference answer; their verifier
            # checks the response itself.
            ground_truth="" if answer is None else str(answer),
            env=self.env,
            agent_name=FAMILY,
            extra={
                ENTRY_KEY: json.dumps(encode_entry(entry), default=_refuse),
                TASK_KEY: self.task,
                CONFIG_KEY: self._options,
            },
        )


def _refuse(value: object) -> object:
    raise TypeError(f"a reasoning-gym item holds a {type(value).__name__}, which JSON cannot carry")


@register_dataset(f"{FAMILY}/*")
def build_procedural(config: DatasetConfig, env: str) -> ProceduralDataset:
    import reasoning_gym

    task = config.name.split("/", 1)[1]
    known = task_names()
    if task not in known:
        close = difflib.get_close_matches(task, known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f" ({len(known)} tasks)"
        raise UnknownDatasetError(f"unknown reasoning-gym task {task!r}{hint}")
    params = dict(config.params)
    size = int(config.max_samples or params.pop("size", DEFAULT_SIZE))
    params.pop("size", None)
    seed = int(params.pop("seed", 0))
    if config.split in VALIDATION_SPLITS:
        seed += _VALIDATION_SEED_OFFSET
    options: dict[str, object] = {**params, "seed": seed, "size": size}
    try:
        items = reasoning_gym.create_dataset(task, **options)
        items[0]  # a bad parameter often fails only when an item is generated
    except Exception as error:  # each task validates its config its own way
        raise DatasetError(
            "params", f"reasoning-gym task {task!r} refused {dict(config.params)}: {error}"
        ) from None
    return ProceduralDataset(f"{config.name}/{config.split}", task, options, items, env)
