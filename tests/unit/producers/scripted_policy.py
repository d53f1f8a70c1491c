"""A scripted policy for episode tests, run by the real :class:`TorchEngine`.

Stand-in, named as such: what these tests need is a model that writes *given* tool calls (a
malformed one, ten at once, one that floods the tool), and no model that does so on cue can be
trained inside a unit test. Everything around it is real: the engine's decode loop, sampling,
log-probs and weight versions, the tokenizer, the tools.

The policy writes turn ``k`` of its script when its context holds ``k`` EOS tokens (each of its
finished turns ends with one; prompts and observations hold none), then EOS.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import torch

from dockyard.engines.torch_engine import TorchEngine
from dockyard.models.tokenizers import DEFAULT_CORPUS, train_bpe_tokenizer

#: The chosen token's logit; every other token's is 0 (its probability is ≈ V·e^-30 from 1).
CHOSEN_LOGIT = 30.0


def tokenizer():
    return train_bpe_tokenizer(DEFAULT_CORPUS, vocab_size=512, style="qwen2")


class ScriptedPolicy(torch.nn.Module):
    def __init__(self, turns: Sequence[Sequence[int]], eos: int, vocab_size: int) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # the engine reads the device off it
        self.turns = [list(turn) for turn in turns]
        self.eos = eos
        self.vocab_size = vocab_size

    def next_token(self, turn: int, position: int) -> int:
        script = self.turns[turn] if turn < len(self.turns) else []
        return script[position] if position < len(script) else self.eos

    def forward(self, input_ids, attention_mask, position_ids=None, past_key_values=None, **_):
        if past_key_values is None:  # a prefill: which turn is this?
            state = [
                (int((row[mask.bool()] == self.eos).sum()), 0)
                for row, mask in zip(input_ids, attention_mask, strict=True)
            ]
        else:
            state = [(turn, position + 1) for turn, position in past_key_values]
        logits = torch.zeros(input_ids.shape[0], input_ids.shape[1], self.vocab_size)
        for row, (turn, position) in enumerate(state):
            logits[row, -1, self.next_token(turn, position)] = CHOSEN_LOGIT
        return SimpleNamespace(logits=logits, past_key_values=state)


def scripted_engine(turn_texts: Sequence[str], tok=None) -> tuple[TorchEngine, object]:
    """A TorchEngine over a policy that writes ``turn_texts`` one turn after the other."""
    tok = tok or tokenizer()
    turns = [tok.encode(text, add_special_tokens=False) for text in turn_texts]
    policy = ScriptedPolicy(turns, tok.eos_token_id, len(tok))
    engine = TorchEngine(
        policy, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id, tokenizer=tok
    )
    return engine, tok


class ScriptedVisionPolicy(ScriptedPolicy):
    """The script, for a vision-language engine: it also holds the tiny Qwen2-VL's inner model
    (``model``), whose ``get_rope_index`` the engine asks for the requests' 3-D positions (real
    code); the pixel values reach ``forward`` and are ignored there, like everything else."""

    def __init__(self, turns: Sequence[Sequence[int]], eos: int, vocab_size: int) -> None:
        from dockyard.models.tiny_vlm import build_qwen2_vl_policy

        super().__init__(turns, eos, vocab_size)
        self.model = build_qwen2_vl_policy()[0].model


def scripted_vision_engine(turn_texts: Sequence[str], processor) -> TorchEngine:
    """A TorchEngine showing images to a policy that writes ``turn_texts`` one after another."""
    tok = processor.tokenizer
    turns = [tok.encode(text, add_special_tokens=False) for text in turn_texts]
    policy = ScriptedVisionPolicy(turns, tok.eos_token_id, len(tok))
    return TorchEngine(
        policy,
        eos_token_ids=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
        tokenizer=tok,
        processor=processor,
    )
