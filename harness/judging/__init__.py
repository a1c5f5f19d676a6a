"""Judging what a target returned: the checks (one registry, harness/judging/registry.py), their metrics,
the evidence kept for the report, and the diagnosis of a failing case."""
