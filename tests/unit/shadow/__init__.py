"""Tests of the shadow: experiment, evidence, gates, manager, releases."""

from ragplane.server.shadow.config import Gates

# Gates for fake embedders: small minimums, and no A/A floor or shadow-time minimum (fakes
# take microseconds, and a test cannot wait a day); each test raises what it judges.
LAX = Gates(
    min_samples=10,
    min_probes=5,
    min_timed_batches=6,
    max_aa_ratio=1e9,
    min_releases=1,
    min_release_hours=0,
    min_release_batches=0,
)
