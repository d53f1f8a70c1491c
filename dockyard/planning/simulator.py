"""A discrete-event simulation (SimPy) of dockyard's pipeline over a fleet.

What it models, each with the rule of the code it stands for:

- the dispatcher tops the pipeline up to its in-flight budget, ``(max_age + 1) × groups per
  step`` async or one step's groups sync, each group stamped with the trainer's version
  (``producers/dispatcher.py``); groups leave the budget when trained or dropped;
- a rollout worker takes the first group waiting plus up to ``fetch_batch − 1`` more, waits
  until it has loaded the version its groups were dispatched at, at most ``max_refit_wait_s``
  (``RolloutWorker.process``),
  and generates the batch in ``gen_batch_s + n × gen_group_s``, every token stamped with the
  version it holds; a refit task follows the site's versions and loads the newest in
  ``refit_s`` as soon as the engine is free (refits land between batches);
- a group is scored at its worker's site (a pool of scorers, each scoring
  ``scorer_concurrency`` groups at once), then crosses the WAN to the
  trainer (one link per site, one direction each way, transfers in series at the link's rate
  plus its latency);
- the trainer drops a group whose age (its version to the trainer's) exceeds ``max_age`` when it
  comes in and again after every step (``consumers/trainer/intake.py``), trains ``groups per step``
  groups in ``train_step_s``, publishes the next version in ``publish_s`` and does its
  bookkeeping in ``step_overhead_s``; every pass through the broker costs ``hop_s``;
- each version crosses each site's link once (a full snapshot, or with patches a patch of
  ``1 / patch_ratio`` of the bytes between snapshots every ``snapshot_every`` versions), and every
  worker at the site then loads it from the site's copy in ``refit_s``.

With ``shared_cores`` every stage's work also queues for one of that many cores (all roles on
one machine, as in the calibration runs on this machine); without it each role has its own.

Not modelled: failures and redeliveries, the broker's own per-message time on one machine
(calibrated into the stage costs), patch encode/apply CPU time, dynamic sampling.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import simpy

from dockyard.planning.fleet import FleetSpec, Prediction

# A simpy process: it yields events and is resumed with each one's value.
_Process = Generator[simpy.Event, Any, None]


@dataclass
class _Group:
    dispatch_version: int
    version: int = -1  # the weights it was generated with


@dataclass
class _Site:
    link_out: simpy.Resource  # trainer → site (weights)
    link_in: simpy.Resource  # site → trainer (experience)
    scorers: simpy.Resource
    arrived: simpy.Event  # fires when a newer version arrives
    version: int = 0  # newest weight version held at the site


@dataclass
class _Worker:
    site: _Site
    engine: simpy.Resource  # held by a generation batch or a refit: one at a time
    loaded: simpy.Event  # fires when the worker loads a newer version
    version: int = 0
    loaded_at: dict[int, float] = field(default_factory=dict)


class FleetSimulation:
    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec.validated()
        self.env = simpy.Environment()
        self.queue: simpy.Store = simpy.Store(self.env)  # the prompt work queue
        self.cores = simpy.Resource(self.env, spec.shared_cores) if spec.shared_cores else None
        self.sites = [self._site() for _ in range(spec.sites)]
        # Workers spread round-robin: site i holds workers i, i + M, i + 2M...
        self.workers = [
            _Worker(self.sites[i % spec.sites], simpy.Resource(self.env, 1), self.env.event())
            for i in range(spec.workers)
        ]
        self.inbox: list[_Group] = []  # scored groups arrived at the trainer, not taken yet
        self.wake = self.env.event()
        self.version = 0
        self.in_flight = 0
        self.published_at: dict[int, float] = {0: 0.0}
        self.wan_bytes = 0
        self.step_ends: list[float] = []
        self.ages: dict[int, int] = {}
        self.dropped = 0

    def _site(self) -> _Site:
        site = _Site(
            simpy.Resource(self.env, 1),
            simpy.Resource(self.env, 1),
            simpy.Resource(
                self.env, self.spec.scorers_per_site * self.spec.rules.scorer_concurrency
            ),
            arrived=self.env.event(),
        )
        return site

    def _compute(self, seconds: float) -> _Process:
        """A stage's work: on a fleet every role has its own hardware; with ``shared_cores``
        (every role on one machine, as the calibration runs here) it queues for a core."""
        if self.cores is None:
            yield self.env.timeout(seconds)
            return
        with self.cores.request() as turn:
            yield turn
            yield self.env.timeout(seconds)

    # --- the WAN -------------------------------------------------------------------------

    def _cross(self, link: simpy.Resource, nbytes: int) -> _Process:
        """One transfer over a site's link: in series with the link's other transfers at its
        rate, then the latency (a pipe: the next transfer need not wait for it)."""
        if self.spec.wan_mbit is None and self.spec.latency_ms == 0:
            return
        if self.spec.wan_mbit is not None:
            with link.request() as turn:
                yield turn
                yield self.env.timeout(nbytes * 8 / (self.spec.wan_mbit * 1e6))
        yield self.env.timeout(self.spec.latency_ms / 1000)

    # --- weights -------------------------------------------------------------------------

    def _weight_bytes(self, version: int) -> int:
        full = self.spec.costs.weight_bytes
        rules = self.spec.rules
        if not rules.patches or version % rules.snapshot_every == 0:
            return full
        return round(full / (self.spec.patch_ratio or 1.0))

    def _ship(self, site: _Site, version: int) -> _Process:
        nbytes = self._weight_bytes(version)
        if self.spec.wan_mbit is not None:
            self.wan_bytes += nbytes
        yield from self._cross(site.link_out, nbytes)
        if version > site.version:
            site.version = version
            arrived, site.arrived = site.arrived, self.env.event()
            arrived.succeed()

    def _follow_weights(self, worker: _Worker) -> _Process:
        """The worker's refit task: each time a newer version reaches its site, load it as
        soon as the engine is free (between batches), the newest there when the load starts."""
        while True:
            if worker.site.version <= worker.version:
                yield worker.site.arrived
                continue
            with worker.engine.request() as turn:
                yield turn
                target = worker.site.version
                yield from self._compute(self.spec.costs.refit_s)
            worker.version = target
            worker.loaded_at.setdefault(target, self.env.now)
            loaded, worker.loaded = worker.loaded, self.env.event()
            loaded.succeed()

    # --- the roles -----------------------------------------------------------------------

    def _rollout_worker(self, worker: _Worker) -> _Process:
        costs = self.spec.costs
        while True:
            batch = [(yield self.queue.get())]
            while self.queue.items and len(batch) < self.spec.rules.fetch_batch:
                batch.append((yield self.queue.get()))
            yield from self._compute(costs.hop_s)
            # The prompts reach the site: a few hundred bytes that interleave with a weight
            # transfer's chunks on the link, so only the latency counts.
            yield self.env.timeout(self.spec.latency_ms / 1000)
            # Weights at least as new as those current when the groups were dispatched, waited
            # for up to max_refit_wait_s; then the worker generates with what it has (and the
            # trainer may drop the groups as too old).
            deadline = self.env.timeout(self.spec.rules.max_refit_wait_s)
            while worker.version < max(g.dispatch_version for g in batch):
                yield worker.loaded | deadline
                if deadline.processed:
                    break
            with worker.engine.request() as turn:
                yield turn
                version = worker.version
                yield from self._compute(costs.gen_batch_s + len(batch) * costs.gen_group_s)
            for group in batch:
                group.version = version
                self.env.process(self._score_and_deliver(worker.site, group))

    def _score_and_deliver(self, site: _Site, group: _Group) -> _Process:
        yield from self._compute(self.spec.costs.hop_s)
        with site.scorers.request() as turn:
            yield turn
            yield from self._compute(self.spec.costs.score_s)
        yield from self._cross(site.link_in, self.spec.costs.rollout_bytes)
        yield from self._compute(self.spec.costs.hop_s)
        self.inbox.append(group)
        if not self.wake.triggered:
            self.wake.succeed()

    def _top_up(self) -> None:
        while self.in_flight < self.spec.rules.in_flight_capacity:
            self.in_flight += 1
            self.queue.put(_Group(dispatch_version=self.version))

    def _too_old(self, group: _Group) -> bool:
        if self.version - group.version <= self.spec.rules.max_age:
            return False
        self.dropped += 1
        self.in_flight -= 1
        return True

    def _trainer(self) -> _Process:
        rules, costs = self.spec.rules, self.spec.costs
        pending: list[_Group] = []
        while len(self.step_ends) < rules.steps:
            self._top_up()
            pending += [g for g in self.inbox if not self._too_old(g)]
            self.inbox.clear()
            if len(pending) < rules.num_prompts_per_step:
                self.wake = self.env.event()
                yield self.wake
                continue
            step, pending = (
                pending[: rules.num_prompts_per_step],
                pending[rules.num_prompts_per_step :],
            )
            for group in step:
                age = self.version - group.version
                self.ages[age] = self.ages.get(age, 0) + 1
            yield from self._compute(costs.train_step_s)
            self.in_flight -= len(step)
            self.version += 1
            yield from self._compute(costs.publish_s)
            self.published_at[self.version] = self.env.now
            for site in self.sites:
                self.env.process(self._ship(site, self.version))
            yield from self._compute(costs.step_overhead_s)
            self.step_ends.append(self.env.now)
            pending = [g for g in pending if not self._too_old(g)]

    # --- the run -------------------------------------------------------------------------

    def run(self) -> Prediction:
        for worker in self.workers:
            self.env.process(self._rollout_worker(worker))
            self.env.process(self._follow_weights(worker))
        self.env.run(until=self.env.process(self._trainer()))
        return self._prediction()

    def _prediction(self) -> Prediction:
        rules, costs = self.spec.rules, self.spec.costs
        steps = len(self.step_ends)
        busy = costs.train_step_s + costs.publish_s + costs.step_overhead_s
        steady_s = self.step_ends[-1] - self.step_ends[0]
        if steady_s > 0:
            steps_per_s = (steps - 1) / steady_s
            idle = 1 - (steps - 1) * busy / steady_s
        else:  # one step, or steps that take no time: no steady state to measure
            steps_per_s = float("inf") if steps > 1 else 0.0
            idle = 0.0
        return Prediction(
            steps=steps,
            wall_s=self.step_ends[-1],
            steady_s=steady_s,
            groups_trained=steps * rules.num_prompts_per_step,
            groups_dropped_stale=self.dropped,
            groups_per_s=steps_per_s * rules.num_prompts_per_step,
            steps_per_s=steps_per_s,
            trainer_busy_s=steps * busy,
            trainer_idle_fraction=idle,
            staleness=dict(sorted(self.ages.items())),
            weight_propagation_s=self._propagation_s(),
            weight_bytes_on_wan=self.wan_bytes,
        )

    def _propagation_s(self) -> float:
        """Mean time from publication until the last worker loaded it, over the versions every
        worker loaded (a worker skips a version a newer one overtook)."""
        delays = [
            max(w.loaded_at[v] for w in self.workers) - at
            for v, at in self.published_at.items()
            if v > 0 and all(v in w.loaded_at for w in self.workers)
        ]
        return sum(delays) / len(delays) if delays else 0.0


def simulate(spec: FleetSpec) -> Prediction:
    return FleetSimulation(spec).run()
