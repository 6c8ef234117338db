"""One declared case-of-use as the shadow manager runs it, and one sampled batch."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ragplane.server.embedding.base import Embedder
from ragplane.server.shadow.config import PairConfig
from ragplane.server.shadow.experiment import Experiment
from ragplane.server.shadow.probes import ProbeSet


@dataclass(frozen=True)
class Batch:
    """What the experiment carries for one sampled batch: the texts and their class."""

    texts: list[str]
    cls: str


@dataclass
class Case:
    cfg: PairConfig
    canonical: Embedder
    shadow: Embedder
    serving: str
    hardware: str = ""
    # the flip now in force was forced by an admin: the watch reports, but does not undo,
    # what an admin chose against the gates
    forced: bool = False
    # timed batches so far per traffic class: the order of the runs alternates in each
    timed: dict[str, int] = field(default_factory=dict)
    experiment: Experiment | None = None
    probes: ProbeSet = field(default_factory=lambda: ProbeSet(0, random.Random()))
    published: int = 0
    # G1 as (checked at, passed), so compatible() -- run on every text search of a
    # collection whose embedder differs from the serving one -- reads the evidence store
    # at most once per the manager's COMPATIBLE_TTL_S; new evidence clears it
    g1: tuple[float, bool] | None = None
