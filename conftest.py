"""Project-wide pytest configuration.

Hypothesis runs derandomized under CI (CI=true), so a red CI run reproduces locally
with the same examples; locally it explores new examples each run.
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
