"""Checkpoints on disk: crash-safe step directories with retention (:mod:`.directories`) and the
model-weights files inside them, with their conversion to a Hugging Face directory
(:mod:`.model_files`). What a *trainer* checkpoint holds besides the model is the trainer's
(:mod:`dockyard.consumers.trainer.trainer_checkpoint`)."""
