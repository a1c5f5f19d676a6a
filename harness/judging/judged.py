"""What judging one case leaves for its diagnosis (harness/judging/diagnosis.py): the trajectory every check
judged and the other runs the checks made of the same inputs, by check name. The diagnosis reads these and
never runs a target.

  trajectory  traj[k][i]: member i after step k, the whole parameter (gathered over a distributed layout)
  runs        `scale` and `rescale`: the run with gradients x 2^10 (the same run); `equiv2d`: the
              [out, prod(rest)] run in the case's shape
  device      the device class the case ran on ("cpu", "cuda"): the tolerance policy's measurement
"""

from __future__ import annotations

import dataclasses

from harness.judging.outcome import Outcome, Trajectory

SCALED_RUNS = ("scale", "rescale")
"""The checks whose kept run is the case with gradients x 2^10 (harness.judging.checks.SCALE_FACTOR)."""


@dataclasses.dataclass
class Judged:
    trajectory: Trajectory | None = None
    runs: dict[str, Trajectory] = dataclasses.field(default_factory=dict)
    device: str = "cpu"

    def offer(self, check: str, outcome: Outcome) -> None:
        """Keep the run `outcome` judged the target by, if it made one."""
        if outcome.run is not None:
            self.runs[check] = outcome.run

    def scaled(self) -> Trajectory | None:
        """The run with gradients x 2^10, if a check made one."""
        return next((self.runs[c] for c in SCALED_RUNS if c in self.runs), None)
