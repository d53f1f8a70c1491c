"""``data``: datasets and dataloaders."""

from __future__ import annotations

from pydantic import Field, PositiveInt

from dockyard.config.base import Section
from dockyard.config.errors import ConfigIssue


class FieldMapping(Section):
    """Which field of a file dataset's record holds what (``data.*.path`` datasets only)."""

    prompt: str | None = Field(
        None, description="field holding the prompt text; None = 'prompt' unless messages is set"
    )
    messages: str | None = Field(
        None,
        description="field holding the prompt as a chat (a list of {role, content}); "
        "rendered with the chat template",
    )
    answer: str = Field("answer", description="field holding the ground truth the env scores")
    metadata: list[str] = Field(
        default_factory=list,
        description="fields copied to the scorer as extra data (string, number, bool or null)",
    )
    tests: str | None = Field(
        None,
        description="field holding the record's test cases, a non-empty list of {input, output} "
        "(stdin/stdout) or {assert} (Python run after the program) objects; copied to the "
        "scorer as extra 'tests' (program_bench, code)",
    )
    images: str | None = Field(
        None,
        description="field holding the record's images: a list of image files, paths relative "
        "to the data file; the prompt shows them before its text (a vision-language policy, "
        "with policy.generation.allow_multimodal_inputs)",
    )
    agent: str | None = Field(
        None,
        description="field holding the record's agent name (a non-empty string; routes it to "
        "its teacher under on-policy distillation); None = the dataset's agent_name",
    )

    def rule_issues(self) -> list[ConfigIssue]:
        if self.prompt is not None and self.messages is not None:
            return [
                ConfigIssue("messages", "set either fields.prompt or fields.messages, not both")
            ]
        return []

    @property
    def prompt_field(self) -> str | None:
        """The plain-text prompt field, or None when the prompt is a chat."""
        if self.messages is not None:
            return None
        return self.prompt or "prompt"


# The built-in processors (dockyard.data.processors holds what each does); a name outside them
# is refused when the config loads, with its key path.
PROCESSORS = ("default", "boxed_answer", "python_program", "shell_script")


def processor_issue(path: str, name: str | None) -> list[ConfigIssue]:
    if name is None or name in PROCESSORS:
        return []
    return [ConfigIssue(path, f"unknown processor {name!r}; built in: {', '.join(PROCESSORS)}")]


class DatasetConfig(Section):
    name: str = Field(
        description="dataset name in the dataset registry; with path, the name the run "
        "records for the file dataset"
    )
    split: str = Field(
        "train",
        description="split of a save_to_disk DatasetDict; for files, replaces {split} in path",
    )
    path: str | None = Field(
        None, description="local .jsonl/.parquet file or save_to_disk directory (no download)"
    )
    fields: FieldMapping = Field(default_factory=FieldMapping)
    agent_name: str | None = Field(
        None,
        min_length=1,
        description="agent name every record of this dataset carries (a teacher is chosen by "
        "it under on-policy distillation); None = the dataset's own ('default' for files "
        "without fields.agent)",
    )
    env: str | None = Field(None, description="environment scoring this data; None = default_env")
    processor: str | None = Field(
        None,
        description="what the task says before the chat template (default, boxed_answer, "
        "python_program, shell_script); None = data.default_processor",
    )
    max_samples: PositiveInt | None = Field(
        None, description="keep the first max_samples records (before shuffling)"
    )
    # Dataset-specific generator parameters (e.g. operand ranges): free-form by nature.
    params: dict[str, int | float | str | bool] = Field(default_factory=dict)

    def rule_issues(self) -> list[ConfigIssue]:
        issues = processor_issue("processor", self.processor)
        if self.agent_name is not None and self.fields.agent is not None:
            issues.append(
                ConfigIssue(
                    "agent_name",
                    "set either agent_name (one agent for every record) or fields.agent "
                    "(each record's own), not both",
                )
            )
        return issues


class DataConfig(Section):
    train: DatasetConfig
    validation: DatasetConfig | None = None
    extra_train_dataloaders: list[DatasetConfig] = Field(
        default_factory=list, description="more than zero means multiple dataloaders"
    )
    max_input_seq_length: PositiveInt | None = None
    shuffle: bool = True
    default_processor: str = Field(
        "default", description="the processor of a dataset that names none (data.*.processor)"
    )
    default_env: str = "math"
    system_prompt: str | None = Field(
        None, description="a system message put before every prompt (applies the chat template)"
    )

    def rule_issues(self) -> list[ConfigIssue]:
        return processor_issue("default_processor", self.default_processor)
