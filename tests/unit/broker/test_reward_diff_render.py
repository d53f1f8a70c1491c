"""`dockyard replay diff`'s text: a one-sided list says how long it is and shows the first ids
(after a partial re-score, one side held 5,292 groups, printed on one line)."""

from __future__ import annotations

from dockyard.broker.reward_diff import LISTED_IDS, RewardDiff, render


def _diff(only_in_against: int) -> RewardDiff:
    ids = [f"g{i}" for i in range(only_in_against)]
    return RewardDiff(subject="ns.rescored.v2", against="ns.experience.scored", only_in_against=ids)


def test_a_long_one_sided_list_shows_its_length_and_its_first_ids():
    [line] = [text for text in render(_diff(5292)).splitlines() if text.startswith("only in")]
    first = ", ".join(f"g{i}" for i in range(LISTED_IDS))
    assert line == (
        f"only in ns.experience.scored: 5292 groups: {first}, … and {5292 - LISTED_IDS} more "
        "(--all-groups lists them, --json has them all)"
    )


def test_all_groups_and_short_lists_show_every_id():
    [line] = [
        text for text in render(_diff(5292), all_groups=True).splitlines() if "only in" in text
    ]
    assert line.endswith("g5290, g5291") and "more" not in line
    [short] = [text for text in render(_diff(3)).splitlines() if text.startswith("only in")]
    assert short == "only in ns.experience.scored: 3 groups: g0, g1, g2"
