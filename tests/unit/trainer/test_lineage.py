"""Ages of weight versions along the trainer's lineage, across clean and crashed resumes."""

from __future__ import annotations

from dockyard.consumers.trainer.lineage import VersionLineage


def test_a_fresh_run_counts_versions_as_steps():
    lineage = VersionLineage.starting_at(0)
    assert lineage.age(3, 5) == 2 and lineage.age(5, 5) == 0


def test_a_clean_resume_keeps_the_checkpoints_weights_at_age_zero():
    lineage = VersionLineage.starting_at(0)
    lineage.resumed(checkpoint_version=3, published=3, new_version=4)  # same weights as v3
    assert lineage.age(3, 4) == 0 and lineage.age(2, 4) == 1
    assert lineage.age(3, 6) == 2  # two steps after the resume


def test_versions_published_after_the_checkpoint_are_a_lost_branch():
    lineage = VersionLineage.starting_at(0)
    # Crashed after publishing v5; the last checkpoint had v3. v4, v5 are gone.
    lineage.resumed(checkpoint_version=3, published=5, new_version=6)
    assert lineage.age(3, 6) == 0
    assert lineage.age(4, 6) == 1 and lineage.age(5, 6) == 2  # through the branch point
    assert lineage.age(5, 8) == 4  # and further as training goes on
    assert lineage.age(7, 8) == 1


def test_it_survives_the_checkpoint_and_old_checkpoints_read_as_one_line():
    lineage = VersionLineage.starting_at(2)  # an incarnation without checkpoint used 0, 1
    lineage.resumed(checkpoint_version=5, published=7, new_version=8)
    restored = VersionLineage.from_dict(lineage.to_dict())
    assert restored == lineage
    assert restored.age(1, 8) == restored.position(8) - 0 + 2  # 0..1 branch from the start
    assert VersionLineage.from_dict(None).age(3, 9) == 6
