"""``program_bench``: program synthesis scored by the record's tests in the sandbox.

The ``code`` environment's scoring (stdin/stdout and ``assert`` cases, one sandbox session per
case, ``reward_mode`` fraction or all_pass) on benchmark records: the cases come from
``data.*.fields.tests`` (``extra["tests"]``), the record's ``answer`` is its reference solution
(what ``dockyard sft`` trains on), and the response is read up to its first end-of-turn marker,
so a program written without a code fence does not end in ``<|im_end|>``.
"""

from __future__ import annotations

import threading

from dockyard.config.sections.env import ProgramBenchEnvConfig
from dockyard.environments.arithmetic_env import answer_before_eos
from dockyard.environments.base import SampleScore
from dockyard.environments.code_env import CodeEnvironment, TestCase
from dockyard.environments.registry import register_environment


@register_environment
class ProgramBenchEnvironment(CodeEnvironment):
    name = "program_bench"
    settings: ProgramBenchEnvConfig

    def score_program(
        self,
        response: str,
        cases: list[TestCase],
        deadline: float | None = None,
        cancel: threading.Event | None = None,
    ) -> SampleScore:
        text, _ = answer_before_eos(response, self.settings.eos_markers)
        return super().score_program(text, cases, deadline, cancel)
