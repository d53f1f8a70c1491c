"""The async-GRPO trainer: batch assembly, the optimizer step, SFT warm start, validation,
checkpoints, and the loop that consumes scored groups from the data plane."""
