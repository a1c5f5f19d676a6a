"""Mutation testing of the optimizers and the oracles, with the harness as the oracle.

Mutants are cosmic-ray's (its standard operators; mutants.py); each is judged by what executes its
line (selection.py, from the coverage map of reach.py): the harness's CI cases against the FP64
oracles, gloo cases for distributed code, the unit tests (validation, state, checkpoints, the
negative controls) for the rest, in a forked process on a scratch copy of the project (workers.py,
judge.py). Sessions resume (session.py); survivors are triaged against a reviewed list of
equivalent mutants (equivalent.py, equivalent.toml); the table per module is table.py's.
Usage: `python -m benchmarks.mutation --help`; the tools and why: docs/contributing.md, Dependencies.
"""
