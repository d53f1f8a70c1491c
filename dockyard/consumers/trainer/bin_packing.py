"""Bin packing of sequence lengths into token budgets (``policy.sequence_packing.algorithm``).

Both algorithms return bins as lists of indices into ``lengths``; every index appears exactly
once and no bin's lengths sum above ``capacity``. A length above ``capacity`` is refused: it could
only be trained by splitting a sequence, which would change the loss.

- ``first_fit_decreasing`` (FFD): longest first, each into the first bin with room.
- ``modified_first_fit_decreasing`` (MFFD, Johnson & Garey 1985): items are classed as large
  (> C/2), medium (> C/3), small (> C/6) and tiny; each large item opens a bin; the bins take
  one medium item each (largest that fits, going forward); bins without a medium item take the
  two smallest small items going backward (the second one as large as still fits); what is left
  is placed first fit, largest first, into the existing bins and then into new ones. Its worst
  case is 71/60 of the optimum against FFD's 11/9, and it is the default of the reference system.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

PackingAlgorithm = Literal["modified_first_fit_decreasing", "first_fit_decreasing"]


def _check(lengths: Sequence[int], capacity: int) -> None:
    if capacity <= 0:
        raise ValueError(f"the token budget must be positive, got {capacity}")
    for index, length in enumerate(lengths):
        if length < 0:
            raise ValueError(f"sequence {index} has a negative length {length}")
        if length > capacity:
            raise ValueError(
                f"sequence {index} has {length} tokens, more than the micro-batch token budget "
                f"{capacity}; raise the budget (train_mb_tokens / logprob_mb_tokens) to at "
                "least policy.max_total_sequence_length"
            )


def _first_fit(
    order: Sequence[int],
    lengths: Sequence[int],
    capacity: int,
    bins: list[list[int]],
    fill: list[int],
) -> None:
    for index in order:
        length = lengths[index]
        for slot, used in enumerate(fill):
            if used + length <= capacity:
                bins[slot].append(index)
                fill[slot] += length
                break
        else:
            bins.append([index])
            fill.append(length)


def _decreasing(indices: Sequence[int], lengths: Sequence[int]) -> list[int]:
    # Ties keep the input order, so the result is deterministic.
    return sorted(indices, key=lambda index: -lengths[index])


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    _check(lengths, capacity)
    bins: list[list[int]] = []
    fill: list[int] = []
    _first_fit(_decreasing(range(len(lengths)), lengths), lengths, capacity, bins, fill)
    return bins


def modified_first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    _check(lengths, capacity)
    large = [i for i, n in enumerate(lengths) if n * 2 > capacity]
    medium = [i for i, n in enumerate(lengths) if n * 3 > capacity >= n * 2]
    small = [i for i, n in enumerate(lengths) if n * 6 > capacity >= n * 3]
    tiny = [i for i, n in enumerate(lengths) if capacity >= n * 6]
    bins = [[i] for i in _decreasing(large, lengths)]
    fill = [lengths[b[0]] for b in bins]
    medium = _decreasing(medium, lengths)
    has_medium = [False] * len(bins)
    for slot in range(len(bins)):  # forward: the largest medium item that fits
        fitting = next((i for i in medium if fill[slot] + lengths[i] <= capacity), None)
        if fitting is not None:
            medium.remove(fitting)
            bins[slot].append(fitting)
            fill[slot] += lengths[fitting]
            has_medium[slot] = True
    small = sorted(small, key=lambda index: lengths[index])  # ascending
    for slot in reversed(range(len(bins))):  # backward: two small items per medium-free bin
        if has_medium[slot] or len(small) < 2:
            continue
        room = capacity - fill[slot]
        if lengths[small[0]] + lengths[small[1]] > room:
            continue
        first = small.pop(0)
        second = max(
            (i for i in small if lengths[i] <= room - lengths[first]),
            key=lambda index: lengths[index],
        )
        small.remove(second)
        bins[slot].extend([first, second])
        fill[slot] += lengths[first] + lengths[second]
    rest = _decreasing(medium + small + tiny, lengths)
    _first_fit(rest, lengths, capacity, bins, fill)
    return bins


def pack(lengths: Sequence[int], capacity: int, algorithm: PackingAlgorithm) -> list[list[int]]:
    if algorithm == "first_fit_decreasing":
        return first_fit_decreasing(lengths, capacity)
    if algorithm == "modified_first_fit_decreasing":
        return modified_first_fit_decreasing(lengths, capacity)
    raise ValueError(f"unknown packing algorithm {algorithm!r}")
