"""How the rewards of one stored subject differ from another's (``dockyard replay diff``).

Typically a re-score (``NS.rescored.<name>``) against the live ``scored`` subject, or two
re-scores against each other. Groups are paired by group id and samples by index. ``against``
is the baseline: the confusion table's rows are its rewards, the columns the subject's. Every
message, group and sample that could not be compared is named in the result, none dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from dockyard.broker.inspect import Undecodable, decode_stored
from dockyard.broker.plane import StoredMessage
from dockyard.schemas import ScoredRollout

#: The rewards the confusion table counts; a pair with any other reward is counted apart.
BINARY = (0.0, 1.0)


@dataclass(frozen=True)
class GroupRewards:
    group_id: str
    environment: str
    against: tuple[float, ...]  # the baseline's rewards, by sample index
    subject: tuple[float, ...]

    @property
    def changed_samples(self) -> int:
        return sum(1 for a, b in zip(self.against, self.subject, strict=True) if a != b)


@dataclass
class EnvironmentRewards:
    groups: int = 0
    samples: int = 0
    changed_samples: int = 0
    changed_groups: int = 0
    against_sum: float = 0.0
    subject_sum: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "groups": self.groups,
            "samples": self.samples,
            "changed_groups": self.changed_groups,
            "changed_samples": self.changed_samples,
            "against_mean_reward": self.against_sum / self.samples if self.samples else None,
            "subject_mean_reward": self.subject_sum / self.samples if self.samples else None,
        }


@dataclass(frozen=True)
class Unusable:
    """A stored message left out of the comparison."""

    subject: str
    seq: int
    reason: str
    detail: str


@dataclass
class RewardDiff:
    subject: str
    against: str
    groups: list[GroupRewards] = field(default_factory=list)
    by_environment: dict[str, EnvironmentRewards] = field(default_factory=dict)
    #: ``(against reward, subject reward)`` -> sample pairs, for pairs of 0/1 rewards.
    confusion: dict[tuple[int, int], int] = field(
        default_factory=lambda: {(a, b): 0 for a in (0, 1) for b in (0, 1)}
    )
    non_binary_pairs: int = 0
    only_in_subject: list[str] = field(default_factory=list)
    only_in_against: list[str] = field(default_factory=list)
    #: Groups in both whose sample counts differ: ``(group id, against's, subject's)``.
    mismatched: list[tuple[str, int, int]] = field(default_factory=list)
    #: Group ids stored more than once on one side (the later message is compared).
    repeated: list[tuple[str, str]] = field(default_factory=list)
    unusable: list[Unusable] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "subject": self.subject,
            "against": self.against,
            "by_environment": {k: v.to_json() for k, v in sorted(self.by_environment.items())},
            "confusion": {f"{a}->{b}": count for (a, b), count in sorted(self.confusion.items())},
            "non_binary_pairs": self.non_binary_pairs,
            "groups": [
                {
                    "group_id": g.group_id,
                    "environment": g.environment,
                    "against": list(g.against),
                    "subject": list(g.subject),
                    "changed_samples": g.changed_samples,
                }
                for g in self.groups
            ],
            "only_in_subject": self.only_in_subject,
            "only_in_against": self.only_in_against,
            "mismatched": [
                {"group_id": g, "against_samples": a, "subject_samples": s}
                for g, a, s in self.mismatched
            ],
            "repeated": [{"subject": s, "group_id": g} for s, g in self.repeated],
            "unusable": [
                {"subject": u.subject, "seq": u.seq, "reason": u.reason, "detail": u.detail}
                for u in self.unusable
            ],
        }


def _by_group(
    subject: str, stored: Iterable[StoredMessage], diff: RewardDiff
) -> dict[str, ScoredRollout]:
    out: dict[str, ScoredRollout] = {}
    for message in stored:
        decoded = decode_stored(message)
        if isinstance(decoded, Undecodable):
            diff.unusable.append(Unusable(subject, message.seq, decoded.reason, decoded.detail))
            continue
        if not isinstance(decoded, ScoredRollout):
            detail = f"a {type(decoded).SCHEMA_NAME} message carries no rewards"
            diff.unusable.append(Unusable(subject, message.seq, "not_scored", detail))
            continue
        group_id = decoded.rollout.group.group_id
        if group_id in out:
            diff.repeated.append((subject, group_id))
        out[group_id] = decoded
    return out


def _rewards(scored: ScoredRollout) -> tuple[float, ...]:
    by_index = {score.sample_index: score.reward for score in scored.scores}
    return tuple(by_index[i] for i in sorted(by_index))


def reward_diff(
    subject: str,
    subject_messages: Iterable[StoredMessage],
    against: str,
    against_messages: Iterable[StoredMessage],
) -> RewardDiff:
    diff = RewardDiff(subject, against)
    new = _by_group(subject, subject_messages, diff)
    old = _by_group(against, against_messages, diff)
    diff.only_in_subject = [g for g in new if g not in old]
    diff.only_in_against = [g for g in old if g not in new]
    for group_id, before_message in old.items():
        after_message = new.get(group_id)
        if after_message is None:
            continue
        before, after = _rewards(before_message), _rewards(after_message)
        if len(before) != len(after):
            diff.mismatched.append((group_id, len(before), len(after)))
            continue
        rewards = GroupRewards(group_id, before_message.rollout.group.environment, before, after)
        diff.groups.append(rewards)
        env = diff.by_environment.setdefault(rewards.environment, EnvironmentRewards())
        env.groups += 1
        env.samples += len(before)
        env.changed_samples += rewards.changed_samples
        env.changed_groups += rewards.changed_samples > 0
        env.against_sum += sum(before)
        env.subject_sum += sum(after)
        for a, b in zip(before, after, strict=True):
            if a in BINARY and b in BINARY:
                diff.confusion[(int(a), int(b))] += 1
            else:
                diff.non_binary_pairs += 1
    return diff


def _fmt(value: object) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


#: Group ids a one-sided list shows before it says how many more there are (a partial
#: re-score leaves thousands on one side).
LISTED_IDS = 10


def _listed(ids: Sequence[str], *, all_groups: bool) -> str:
    if all_groups or len(ids) <= LISTED_IDS:
        return f"{len(ids)} groups: {', '.join(ids)}"
    return (
        f"{len(ids)} groups: {', '.join(ids[:LISTED_IDS])}, … and {len(ids) - LISTED_IDS} more "
        "(--all-groups lists them, --json has them all)"
    )


def render(diff: RewardDiff, *, all_groups: bool = False) -> str:
    """The diff as text: per environment, the changed groups (all with ``all_groups``), the
    0/1 confusion table and everything that could not be compared."""
    lines = [f"rewards of {diff.subject} against {diff.against}", "", "per environment:"]
    lines.append("  env  groups  changed-groups  samples  changed-samples  mean-against  mean")
    for name, env in sorted(diff.by_environment.items()):
        row = env.to_json()
        lines.append(
            f"  {name}  {env.groups}  {env.changed_groups}  {env.samples}  "
            f"{env.changed_samples}  {_fmt(row['against_mean_reward'])}  "
            f"{_fmt(row['subject_mean_reward'])}"
        )
    shown = [g for g in diff.groups if all_groups or g.changed_samples]
    lines += ["", f"groups ({len(shown)} of {len(diff.groups)} shown):"]
    for group in shown:
        lines.append(
            f"  {group.group_id} [{group.environment}]  "
            f"{' '.join(_fmt(r) for r in group.against)} -> "
            f"{' '.join(_fmt(r) for r in group.subject)}"
        )
    c = diff.confusion
    lines += [
        "",
        f"0/1 rewards (rows: {diff.against}, columns: {diff.subject}):",
        "         ->0  ->1",
        f"  0     {c[(0, 0)]:>4} {c[(0, 1)]:>4}",
        f"  1     {c[(1, 0)]:>4} {c[(1, 1)]:>4}",
        f"  pairs with a reward other than 0 or 1: {diff.non_binary_pairs}",
    ]
    for subject, ids in (
        (diff.subject, diff.only_in_subject),
        (diff.against, diff.only_in_against),
    ):
        if ids:
            lines.append(f"only in {subject}: {_listed(ids, all_groups=all_groups)}")
    for group_id, a, s in diff.mismatched:
        lines.append(f"not compared: {group_id} has {a} samples in {diff.against}, {s} here")
    for subject, group_id in diff.repeated:
        lines.append(f"stored more than once on {subject}: {group_id} (the last is compared)")
    for item in diff.unusable:
        lines.append(f"left out: {item.subject} seq {item.seq}: {item.reason}: {item.detail}")
    return "\n".join(lines)
