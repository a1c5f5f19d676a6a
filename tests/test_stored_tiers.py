"""Stored tiers (cases/stored.py): read back as the very cases the generator makes, never for other source,
and any trouble with the folder costs only the generation."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cases import Case, stored, tiers

CASES = tuple(tiers.tier("gpu"))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MUON_CONFORMANCE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def counting(cases: tuple[Case, ...]):
    calls = []

    def generate() -> tuple[Case, ...]:
        calls.append(1)
        return cases
    return generate, calls


def test_the_stored_ci_tier_is_the_generated_one():
    assert tiers.tier("ci") == list(tiers.generate("ci"))


def test_a_tier_is_generated_once_then_read_back_as_the_same_cases(cache):
    generate, calls = counting(CASES)
    assert stored.stored_or_generated("gpu", generate) == CASES
    assert stored.stored_or_generated("gpu", generate) == CASES
    assert calls == [1]
    (path,) = cache.iterdir()
    assert path.name == f"tier-gpu-{stored.source_digest()}.txt"
    assert path.read_text().splitlines() == [c.id for c in CASES]


def test_a_stored_file_that_does_not_read_back_is_generated_again_and_replaced(cache):
    generate, calls = counting(CASES)
    stored.stored_or_generated("gpu", generate)
    path = stored.tier_file("gpu")
    path.write_text("not/a/case/id\n")
    assert stored.stored_or_generated("gpu", generate) == CASES and calls == [1, 1]
    assert path.read_text().splitlines() == [c.id for c in CASES]


def test_off_and_an_unwritable_folder_only_cost_the_generation(tmp_path, monkeypatch):
    generate, calls = counting(CASES)
    monkeypatch.setenv("MUON_CONFORMANCE_CACHE", "off")
    assert stored.tier_file("gpu") is None
    assert stored.stored_or_generated("gpu", generate) == CASES
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder would be")
    monkeypatch.setenv("MUON_CONFORMANCE_CACHE", str(blocked))
    assert stored.stored_or_generated("gpu", generate) == CASES and calls == [1, 1]


def test_the_digest_changes_with_any_source_file_of_the_package(tmp_path, monkeypatch):
    """Negative control of the key: an edited generator never reads a tier stored for the old source."""
    copy = tmp_path / "cases"
    shutil.copytree(stored.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(stored, "PACKAGE", copy)
    before = stored.source_digest.__wrapped__()
    assert before == stored.source_digest()
    nested = copy / "algorithms" / "muon.py"
    nested.write_text(nested.read_text() + "\n# an edit\n")
    assert stored.source_digest.__wrapped__() != before


def test_the_default_folder_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("MUON_CONFORMANCE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert stored.folder() == tmp_path / "muon-conformance"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert stored.folder() == Path(os.path.expanduser("~")) / ".cache" / "muon-conformance"
