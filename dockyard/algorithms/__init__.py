"""The math of training: losses, advantage estimators, the GRPO config."""
