"""How many training steps separate a group's weight version from the trainer's, across resumes.

Versions only go up, one per step, and a resumed trainer publishes its checkpoint's weights
under a new number (the fleet must see a new version to refit). So version numbers alone
overstate ages after a resume: the checkpoint's weights are version ``c`` and version ``V0`` at
once, and a group generated with ``c`` is no older than one generated with ``V0``.

Versions a crashed incarnation published after its last checkpoint keep their places on the
line: the resumed trainer replays the scored stream from the checkpoint's position and
recomputes the same steps from the same groups (the design's reproducibility invariant), so
the weights it reaches again at step ``s`` are those the lost version of step ``s`` had. A
group generated with a lost version is therefore judged at the step it is retrained at exactly
as the crashed run judged it, and the lost steps are retrained from the groups they used
instead of those groups being dropped as stale.

Positions count steps from the first weights: a *segment* says that versions from
``first_version`` on sit at ``position + (version - first_version)``; a *lost branch* says that
versions ``first..last`` were published from weights no checkpoint holds, starting at
``branch_position`` (a previous incarnation that left no checkpoint, whose own first version is
unknown), and are as far from the current weights as the path through that point.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Segment:
    first_version: int
    position: int


@dataclass(frozen=True)
class LostBranch:
    first: int
    last: int
    branch_position: int


@dataclass
class VersionLineage:
    segments: list[Segment] = field(default_factory=lambda: [Segment(0, 0)])
    lost: list[LostBranch] = field(default_factory=list)

    @classmethod
    def starting_at(cls, version: int) -> VersionLineage:
        """A fresh run whose first weights are ``version``; lower versions (a previous
        incarnation that left no checkpoint) are a branch that starts from the same weights."""
        lost = [LostBranch(0, version - 1, 0)] if version > 0 else []
        return cls([Segment(version, 0)], lost)

    def resumed(self, checkpoint_version: int, new_version: int) -> None:
        """The checkpoint's weights are published again as ``new_version``. Versions published
        after the checkpoint (before ``new_version``) keep their positions: the replay trains
        their steps again, from the same groups, so they are not a branch that ended."""
        self.segments.append(Segment(new_version, self.position(checkpoint_version)))

    def position(self, version: int) -> int:
        """Steps from the first weights to ``version`` on the live line of training."""
        current = self.segments[0]
        for segment in self.segments:
            if segment.first_version <= version:
                current = segment
        return current.position + (version - current.first_version)

    def age(self, version: int, current: int) -> int:
        """Steps between ``version`` (a group's oldest token) and ``current`` (the trainer's)."""
        for branch in reversed(self.lost):  # the latest loss of a version is the one that counts
            if branch.first <= version <= branch.last:
                on_branch = version - branch.first + 1
                return self.position(current) - branch.branch_position + on_branch
        return self.position(current) - self.position(version)

    def to_dict(self) -> dict[str, list[list[int]]]:
        return {
            "segments": [[s.first_version, s.position] for s in self.segments],
            "lost": [[b.first, b.last, b.branch_position] for b in self.lost],
        }

    @classmethod
    def from_dict(cls, data: dict[str, list[list[int]]] | None) -> VersionLineage:
        """``None`` (a checkpoint written before lineages): one unbroken line of versions."""
        if data is None:
            return cls()
        return cls(
            [Segment(*entry) for entry in data["segments"]],
            [LostBranch(*entry) for entry in data["lost"]],
        )
