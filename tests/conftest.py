"""Shared test configuration: reproducible hypothesis profiles and small accelerator configs."""

import os

from hypothesis import HealthCheck, settings

# Reproducible by default: the same examples every run (CI and locally). `HYPOTHESIS_PROFILE=
# explore` searches with fresh randomness and more examples.
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
