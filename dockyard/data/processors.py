"""Processors: what a record's task says before the chat template renders it.

``data.*.processor`` (else ``data.default_processor``) names one of
:data:`dockyard.config.sections.data.PROCESSORS`. A processor adds the instruction its
environment's scorer relies on — where the answer goes, what form the program or the commands
take — so the data can stay as the benchmark ships it:

- ``default``: the record as it is;
- ``boxed_answer``: asks for the final answer in ``\\boxed{}`` (``answer_format: boxed`` of the
  math, hle and gpqa environments);
- ``python_program``: asks for the program in one ```` ```python ```` block (program_bench, code);
- ``shell_script``: asks for the commands in one ```` ```bash ```` block (terminal_bench, gdpval).

The instruction goes after the prompt text, or after the last user message of a chat record (a
chat with no user message gets it as one).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dockyard.data.base import ChatMessage, Dataset, DatasetError, PromptRecord

DEFAULT_PROCESSOR = "default"

INSTRUCTIONS: dict[str, str] = {
    "boxed_answer": "Put your final answer within \\boxed{}.",
    "python_program": "Write the complete program in a single ```python code block.",
    "shell_script": "Write the shell commands to run in a single ```bash code block.",
}


def process_record(record: PromptRecord, instruction: str) -> PromptRecord:
    if not record.messages:
        return replace(record, prompt=f"{record.prompt}\n\n{instruction}")
    messages = list(record.messages)
    users = [index for index, message in enumerate(messages) if message.role == "user"]
    if not users:
        return replace(record, messages=(*messages, ChatMessage("user", instruction)))
    turn = messages[users[-1]]
    messages[users[-1]] = replace(turn, content=f"{turn.content}\n\n{instruction}")
    return replace(record, messages=tuple(messages))


@dataclass(frozen=True)
class ProcessedDataset:
    """``inner`` with ``instruction`` added to every record's task (when read)."""

    inner: Dataset
    instruction: str

    @property
    def name(self) -> str:
        return self.inner.name

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> PromptRecord:
        return process_record(self.inner[index], self.instruction)


def process_dataset(dataset: Dataset, processor: str) -> Dataset:
    """The dataset as ``processor`` makes it (the config refuses an unknown name at load)."""
    if processor == DEFAULT_PROCESSOR:
        return dataset
    if processor not in INSTRUCTIONS:
        raise DatasetError("processor", f"unknown processor {processor!r}")
    return ProcessedDataset(dataset, INSTRUCTIONS[processor])
