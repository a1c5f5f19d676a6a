"""Running a target on a case: its inputs, where it runs (backends, the rank pool, what each rank runs),
which cases a run takes, and its progress. Nothing here judges."""
