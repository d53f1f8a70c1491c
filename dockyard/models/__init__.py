"""Policy model and tokenizer construction."""
