"""Running a target on a case: its inputs, where it runs (backends, the rank pool, what each rank runs,
the case workers and the helper processes both are), what a case may not carry out of it (guard),
which cases a run takes, and its progress. Nothing here judges."""
