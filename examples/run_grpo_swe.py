"""The configuration spec's example entry point: ``dockyard run`` under the name the spec uses.

    python3 examples/run_grpo_swe.py --config examples/configs/grpo_swe.yaml \
        policy.model_name=Qwen/Qwen2.5-14B-Instruct grpo.num_prompts_per_step=32

Everything after ``--config`` is a Hydra dot-notation override, exactly as for
``dockyard run --config ...``. On this build ``grpo_swe.yaml`` itself stops at launch (its
tensor parallelism and SWE-bench dataset are not available here); ``quickstart.yaml`` runs.
"""

from __future__ import annotations

import sys

from dockyard.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
