"""``env``: per-environment settings, one typed model per registered environment."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from dockyard.config.base import Section
from dockyard.config.errors import ConfigIssue


class EnvSettings(Section):
    """What every environment has: a task timeout with a defined reward, and concurrency."""

    task_timeout: PositiveFloat = Field(60.0, description="seconds per scoring task")
    timeout_reward: float = Field(0.0, description="reward given to a sample that timed out")
    max_concurrency: PositiveInt = Field(8, description="tasks in flight per scorer instance")
    num_scoring_workers: PositiveInt = Field(1, description="scorer processes for this env")


def default_eos_markers() -> list[str]:
    # Scorers decode responses with their special tokens, so the end-of-turn text is there.
    return ["<eos>", "</s>", "<|endoftext|>", "<|im_end|>"]


CHECK_TIMEOUT_DESCRIPTION = (
    "seconds one symbolic answer check (math-verify, in a worker process) may run; past it the "
    "worker is killed and replaced, and the answer scores 0 flagged check_timeout"
)


class MathEnvConfig(EnvSettings):
    answer_format: Literal["boxed_or_last_number", "boxed", "last_number"] = "boxed_or_last_number"
    symbolic_equivalence: bool = True
    relative_tolerance: float = Field(1e-6, ge=0.0)
    check_timeout_s: PositiveFloat = Field(5.0, description=CHECK_TIMEOUT_DESCRIPTION)


class ArithmeticEnvConfig(EnvSettings):
    """The quickstart task: exact integer answers."""

    eos_markers: list[str] = Field(
        default_factory=default_eos_markers,
        description="the answer is the text before the first of these, if the text has one",
    )
    require_stop: bool = Field(
        True, description="a sample cut off by the length limit (no EOS) scores 0"
    )


class ReasoningGymEnvConfig(EnvSettings):
    """Procedural tasks (``data.*.name: reasoning_gym/<task>``) scored by their own verifier."""

    answer_tag: str | None = Field(
        "answer",
        description="the answer is the last <answer_tag>...</answer_tag> of the response "
        "(reasoning-gym's convention); None = the whole response, stripped",
    )


class ChoiceEnvConfig(EnvSettings):
    """Multiple-choice scoring: the response's answer letter against the record's letter."""

    answer_format: Literal["boxed", "marked", "any"] = Field(
        "any",
        description="where the answer letter may be: boxed = only the last \\boxed{}; marked = "
        "also 'Answer: C' / 'the answer is C' / '(C)'; any = also the last standalone choice "
        "letter",
    )
    choices: str = Field(
        "ABCD",
        pattern=r"^[A-Z]{2,26}$",
        description="the answer letters when neither the record's metadata 'choices' nor an "
        "option list in the prompt (lines 'A) ...', '(B) ...', 'C. ...') names them",
    )
    max_response_chars: PositiveInt = Field(
        200_000,
        description="a longer response scores 0 (bounds the scorer's work on runaway output)",
    )
    eos_markers: list[str] = Field(
        default_factory=default_eos_markers,
        description="the response is read up to the first of these (decoded special tokens)",
    )


class GpqaEnvConfig(ChoiceEnvConfig):
    """GPQA-style multiple choice (``data.*.env: gpqa``)."""


class HleEnvConfig(ChoiceEnvConfig):
    """Humanity's-Last-Exam style: exact answers, and multiple choice per record."""

    answer_format: Literal["boxed", "marked", "any"] = Field(
        "marked",
        description="where the answer may be: boxed = only the last \\boxed{}; marked = also "
        "the last 'Answer: ...' line or 'the answer is ...' sentence (and '(C)' for a letter); "
        "any = also the last number (for a letter: the last standalone choice letter)",
    )
    default_answer_type: Literal["exact_match", "multiple_choice"] = Field(
        "exact_match",
        description="how a record without metadata 'answer_type' is scored "
        "(HLE's values exactMatch / multipleChoice are accepted in the metadata)",
    )
    symbolic_equivalence: bool = Field(
        True,
        description="exact answers that differ as text may still be equal as math (math-verify)",
    )
    relative_tolerance: float = Field(1e-6, ge=0.0, description="for numeric exact answers")
    check_timeout_s: PositiveFloat = Field(5.0, description=CHECK_TIMEOUT_DESCRIPTION)


class SandboxLimits(Section):
    """Limits of one sandboxed run (code tests, SWE patch application and test runs)."""

    cpu_time_s: PositiveFloat = Field(10.0, description="RLIMIT_CPU of the run")
    wall_time_s: PositiveFloat = Field(20.0, description="the process group is killed after")
    memory_mb: PositiveInt = Field(
        512,
        description="memory of the whole run (its cgroup: every process, tmpfs pages included) "
        "and RLIMIT_AS of each process",
    )
    max_output_bytes: PositiveInt = Field(1_000_000, description="stdout and stderr, each")
    max_processes: PositiveInt = Field(
        32, description="processes of the whole run (cgroup pids.max) and RLIMIT_NPROC"
    )
    max_disk_mb: PositiveInt = Field(
        1024,
        description="bytes the whole run may write: its work directory, /tmp and /dev/shm are "
        "one tmpfs of this size, at most memory_mb (as root; RAM, charged to the run's memory "
        "when written by it, and kept across the runs of one session)",
    )
    allow_weak_isolation: bool = Field(
        False,
        description="run untrusted code even where the kernel gives no isolation (no bubblewrap "
        "namespaces or no cgroup): then only per-process rlimits and a bypassable Python network "
        "guard apply; default: refuse to start",
    )
    max_file_size_mb: PositiveInt = Field(64, description="RLIMIT_FSIZE")
    max_open_files: PositiveInt = Field(256, description="RLIMIT_NOFILE")
    python_executable: str | None = Field(
        None,
        description="interpreter for sandboxed Python; default: this one if the sandbox uid "
        "can run it, else the first python3 on PATH that it can",
    )
    sandbox_uid_base: int = Field(
        2_000_000_000,
        ge=1000,
        le=4_000_000_000,
        description="when running as root, each run gets its own uid from this range, so "
        "RLIMIT_NPROC and the kill-everything sweep are per run",
    )
    sandbox_uid_count: PositiveInt = Field(1_000_000, le=100_000_000)


class CodeEnvConfig(EnvSettings):
    reward_mode: Literal["fraction", "all_pass"] = "fraction"
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    screen_reward_hacks: bool = Field(
        True,
        description="score a program with a reward-hack shape (frame walking, an always-true "
        "__eq__, test-framework internals...) 0 without running it, flagged "
        "suspected_reward_hack, its group dead-lettered with the evidence",
    )


class ProgramBenchEnvConfig(CodeEnvConfig):
    """Program synthesis (``data.*.env: program_bench``): the ``code`` scorer on a benchmark's
    records, whose test cases come from ``data.*.fields.tests``."""

    eos_markers: list[str] = Field(
        default_factory=default_eos_markers,
        description="the response is read up to the first of these (decoded special tokens), "
        "so an unfenced program does not end in one",
    )


class TerminalBenchEnvConfig(EnvSettings):
    """Single-turn terminal tasks (``data.*.env: terminal_bench``): setup, the response's
    command script, then the task's check script, in one sandbox session."""

    shell: str = Field("bash", description="the shell that runs each script (on the base PATH)")
    eos_markers: list[str] = Field(
        default_factory=default_eos_markers,
        description="the response is read up to the first of these (decoded special tokens)",
    )
    max_script_chars: PositiveInt = Field(
        20_000, description="a longer command script scores 0 (bounds the sandbox's input)"
    )
    limits: SandboxLimits = Field(default_factory=SandboxLimits)


class JudgeConfig(Section):
    """An LLM judge behind an OpenAI-compatible ``/v1/chat/completions`` endpoint."""

    base_url: str | None = Field(
        None, description="the endpoint's base URL (http://host:port); required by the env"
    )
    model: str = Field("judge", description="the model name the endpoint serves")
    api_key_file: str | None = Field(
        None,
        description="file (mode 0600) with the endpoint's API key; unset = "
        "$DOCKYARD_JUDGE_API_KEY if set, else no key",
    )
    temperature: float = Field(0.0, ge=0.0)
    max_tokens: PositiveInt = Field(256, description="of one judgement")
    max_score: PositiveInt = Field(10, description="the rubric scale: reward = score / max_score")
    structured_output: bool = Field(
        True,
        description="ask for the judgement as JSON by schema (response_format json_schema; "
        "vLLM and OpenAI support it); false = by the prompt alone",
    )
    max_retries: NonNegativeInt = Field(
        3,
        description="more attempts per judgement, on a transport error, a 429/5xx, or an "
        "answer that is not a judgement; then a refused judgement is dead-lettered",
    )
    request_timeout_s: PositiveFloat = Field(60.0, description="per request")
    max_file_chars: PositiveInt = Field(
        20_000, description="of each deliverable shown to the judge (the rest is cut, marked)"
    )


class GdpvalEnvConfig(TerminalBenchEnvConfig):
    """File-producing tasks (``data.*.env: gdpval``): the response's command script writes the
    deliverables in the sandbox; a judge grades them by the task's rubric."""

    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    max_deliverable_bytes: PositiveInt = Field(
        1_000_000, description="a larger deliverable file scores 0"
    )


#: OSWorld's two action spaces (``desktop_env``'s ``action_space``).
OsworldActionSpace = Literal["pyautogui", "computer_13"]


class OsworldEnvConfig(EnvSettings):
    """Computer use (``data.*.env: osworld``): the agent drives a desktop through OSWorld's VM
    controller API, one desktop per episode; the task's evaluator reads the final state. Here
    the desktops are the simulator's (``dockyard osworld serve``, a stand-in for OSWorld VMs)."""

    simulator_url: str | None = Field(
        None,
        description="base URL (http://host:port) of the desktop simulator service "
        "(dockyard osworld serve); required by the env and its toolbox",
    )
    action_space: OsworldActionSpace = Field(
        "pyautogui",
        description="how the agent acts (OSWorld's action_space): pyautogui code, or "
        "computer_13's JSON actions (the computer tool's arguments are the action)",
    )
    observation_type: Literal["a11y_tree", "screenshot", "screenshot_a11y_tree"] = Field(
        "a11y_tree",
        description="what the agent is shown with the task and after each action "
        "(OSWorld's observation_type): the accessibility tree as text, the desktop's "
        "screenshot as an image, or both; screenshots need episodes and "
        "policy.generation.allow_multimodal_inputs",
    )
    max_observation_chars: PositiveInt = Field(
        8_000, description="the observation text is cut (marked) past this"
    )
    max_actions: PositiveInt = Field(
        30, description="actions one sample may take (OSWorld's max_steps); past it, refused"
    )
    request_timeout_s: PositiveFloat = Field(10.0, description="per controller request")
    eos_markers: list[str] = Field(
        default_factory=default_eos_markers,
        description="a single-turn response is read up to the first of these",
    )
    task_timeout: PositiveFloat = 120.0


class SWEEnvConfig(EnvSettings):
    reward_mode: Literal["binary", "fraction"] = "binary"
    integrity_check: bool = Field(
        True,
        description="refuse, before sending, patches whose diff headers name a test/runner "
        "path (the sandbox service enforces its own policy on what git apply changes anyway)",
    )
    sandbox_urls: list[str] = Field(default_factory=list)
    sandbox_token_file: str | None = Field(
        None,
        description="file (mode 0600) with the sandbox service's bearer token; unset = "
        "$DOCKYARD_SANDBOX_TOKEN if set, else no token",
    )
    sandbox_ca_file: str | None = Field(
        None,
        description="PEM CA that signed the https sandbox services' certificates; unset = the "
        "system's CAs",
    )
    sandbox_client_cert_file: str | None = Field(
        None, description="PEM client certificate for services that require one (mutual TLS)"
    )
    sandbox_client_key_file: str | None = Field(
        None, description="PEM key (mode 0600) of sandbox_client_cert_file"
    )
    connect_retries: PositiveInt = Field(
        3, description="rounds over sandbox_urls on connection failure, within task_timeout"
    )
    protected_paths: list[str] = Field(
        default_factory=list,
        description="extra globs the early (header) check refuses, beyond the default set; "
        "the service's protected paths are its --policy",
    )
    task_timeout: PositiveFloat = 1800.0
    limits: SandboxLimits = Field(default_factory=SandboxLimits)


class TeacherEnvConfig(EnvSettings):
    """The OPD teacher scorer: attaches teacher log-probs of the sampled tokens."""

    batch_size: PositiveInt = 8
    device: str = "cpu"


class EnvConfig(Section):
    math: MathEnvConfig = Field(default_factory=MathEnvConfig)
    arithmetic: ArithmeticEnvConfig = Field(default_factory=ArithmeticEnvConfig)
    code: CodeEnvConfig = Field(default_factory=CodeEnvConfig)
    swe: SWEEnvConfig = Field(default_factory=SWEEnvConfig)
    teacher: TeacherEnvConfig = Field(default_factory=TeacherEnvConfig)
    reasoning_gym: ReasoningGymEnvConfig = Field(default_factory=ReasoningGymEnvConfig)
    gpqa: GpqaEnvConfig = Field(default_factory=GpqaEnvConfig)
    hle: HleEnvConfig = Field(default_factory=HleEnvConfig)
    program_bench: ProgramBenchEnvConfig = Field(default_factory=ProgramBenchEnvConfig)
    terminal_bench: TerminalBenchEnvConfig = Field(default_factory=TerminalBenchEnvConfig)
    gdpval: GdpvalEnvConfig = Field(default_factory=GdpvalEnvConfig)
    osworld: OsworldEnvConfig = Field(default_factory=OsworldEnvConfig)

    def rule_issues(self) -> list[ConfigIssue]:
        issues: list[ConfigIssue] = []
        judge_url = self.gdpval.judge.base_url
        if judge_url is not None and not judge_url.startswith(("http://", "https://")):
            issues.append(
                ConfigIssue("gdpval.judge.base_url", f"{judge_url!r} is not an http(s) URL")
            )
        simulator = self.osworld.simulator_url
        if simulator is not None and not simulator.startswith(("http://", "https://")):
            issues.append(
                ConfigIssue("osworld.simulator_url", f"{simulator!r} is not an http(s) URL")
            )
        for index, url in enumerate(self.swe.sandbox_urls):
            if not url.startswith(("http://", "https://")):
                issues.append(
                    ConfigIssue(f"swe.sandbox_urls.{index}", f"{url!r} is not an http(s) URL")
                )
        swe = self.swe
        tls_keys = ("sandbox_ca_file", "sandbox_client_cert_file", "sandbox_client_key_file")
        if not any(url.startswith("https://") for url in swe.sandbox_urls):
            # TLS settings without an https URL would be read by nothing.
            issues.extend(
                ConfigIssue(f"swe.{key}", "set, but no swe.sandbox_urls entry is https://")
                for key in tls_keys
                if getattr(swe, key) is not None
            )
        if (swe.sandbox_client_cert_file is None) != (swe.sandbox_client_key_file is None):
            issues.append(
                ConfigIssue(
                    "swe.sandbox_client_key_file",
                    "sandbox_client_cert_file and sandbox_client_key_file go together",
                )
            )
        return issues
