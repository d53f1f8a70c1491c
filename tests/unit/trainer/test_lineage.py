"""Ages of weight versions along the trainer's lineage, across clean and crashed resumes."""

from __future__ import annotations

from dockyard.consumers.trainer.lineage import VersionLineage


def test_a_fresh_run_counts_versions_as_steps():
    lineage = VersionLineage.starting_at(0)
    assert lineage.age(3, 5) == 2 and lineage.age(5, 5) == 0


def test_a_clean_resume_keeps_the_checkpoints_weights_at_age_zero():
    lineage = VersionLineage.starting_at(0)
    lineage.resumed(checkpoint_version=3, new_version=4)  # same weights as v3
    assert lineage.age(3, 4) == 0 and lineage.age(2, 4) == 1
    assert lineage.age(3, 6) == 2  # two steps after the resume


def test_a_lost_step_judges_its_groups_as_the_crashed_run_did():
    # A fresh run publishes version v at step v. It crashed after publishing v15; the last
    # checkpoint had v10. The resumed trainer publishes v10's weights as v16 and replays steps
    # 11..15, so before replayed step s it holds v16 + (s - 1 - 10).
    lineage = VersionLineage.starting_at(0)
    lineage.resumed(checkpoint_version=10, new_version=16)
    for step in range(11, 16):
        before_step = 16 + (step - 1 - 10)
        for generated_with in (step - 2, step - 1):  # what the crashed run took at age <= 1
            # The crashed run trained it at v(step - 1): the age is the same steps apart.
            assert lineage.age(generated_with, before_step) == (step - 1) - generated_with
    assert lineage.age(15, 16 + 5) == 0  # in flight at the crash: as young as it was then
    assert lineage.age(10, 16) == 0 and lineage.age(17, 18) == 1  # the new line goes on


def test_it_survives_the_checkpoint_and_old_checkpoints_read_as_one_line():
    lineage = VersionLineage.starting_at(2)  # an incarnation without checkpoint used 0, 1
    lineage.resumed(checkpoint_version=5, new_version=8)  # 6, 7 lost
    restored = VersionLineage.from_dict(lineage.to_dict())
    assert restored == lineage
    assert restored.age(1, 8) == restored.position(8) - 0 + 2  # 0..1 branch from the start
    assert VersionLineage.from_dict(None).age(3, 9) == 6
