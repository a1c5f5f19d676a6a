"""A run folder is written whole or not at all: the old run survives kill -9 at every stage of a write,
a file-size limit reached mid-write, unwritable files and folders; one writer at a time; every refusal
comes before the first write (reports/run_folder.py)."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from reports.records import Record, RunInfo
from reports.run_folder import StoreError, check, claim, estimated_bytes
from reports.store import load_run, save_run, store_into

ROOT = Path(__file__).parent.parent
INFO = RunInfo(target="ours", tier="ci", backends="cpu", command="python -m harness run",
               started="2025-01-02T03:04:05+00:00", seconds=1.0, torch_version="2.13.0+cpu", commit="abc1234")


def rec(case_id: str, status: str = "pass", ratio: float = 0.5) -> Record:
    return Record(case_id=case_id, check="reference", target="ours", backend="cpu", world_size=1, layout="single",
                  optimizer="muon", layer="linear", shape="4x4", megabatch=1, flatten=False, param_dtype="fp32",
                  compute_dtype="fp32", orthogonalizer="ns", status=status, ratio=ratio)


OLD = [rec("old/a"), rec("old/b", "fail", 3.0)]
NEW = [rec(f"new/{i}") for i in range(3)]


def old_run(tmp_path: Path) -> Path:
    folder = tmp_path / "out"
    save_run(OLD, INFO, folder)
    return folder


def ids(folder: Path) -> list[str]:
    return [r.case_id for r in load_run(folder)[0]]


def leftovers(folder: Path) -> list[str]:
    """What a write leaves beside the folder: staging, aside and lock entries."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


def test_a_run_replaces_the_old_one_whole_and_leaves_nothing_beside_it(tmp_path):
    folder = old_run(tmp_path)
    save_run(NEW, INFO, folder, replace=True)
    assert ids(folder) == [r.case_id for r in NEW]
    assert leftovers(folder) == []


def test_an_empty_folder_takes_a_run_and_a_missing_one_is_created_with_its_parents(tmp_path):
    (tmp_path / "empty").mkdir()
    save_run(NEW, INFO, tmp_path / "empty")
    save_run(NEW, INFO, tmp_path / "a" / "b" / "c")
    assert ids(tmp_path / "empty") == ids(tmp_path / "a" / "b" / "c") == [r.case_id for r in NEW]


@pytest.mark.parametrize("setup, replace, message", [
    (lambda d: save_run(OLD, INFO, d), False, "holds a stored run; --replace replaces it"),
    (lambda d: (d.mkdir(), (d / "notes.txt").write_text("mine")), True, "holds 1 entries and no stored run"),
    (lambda d: (save_run(OLD, INFO, d), (d / "notes.txt").write_text("mine")), True,
     r"entries no run writes \(notes.txt\)"),
    (lambda d: (save_run(OLD, INFO, d), (d / "diff").mkdir()), True, r"entries no run writes \(diff\)"),
    (lambda d: d.write_text("a file"), True, "exists and is not a directory"),
])
def test_what_a_folder_holds_decides_before_anything_is_written(tmp_path, setup, replace, message):
    folder = tmp_path / "out"
    setup(folder)
    before = snapshot(tmp_path)
    with pytest.raises(StoreError, match=message):
        save_run(NEW, INFO, folder, replace=replace)
    assert snapshot(tmp_path) == before


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes (folders as empty entries)."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"") for p in sorted(folder.rglob("*"))}


def test_the_filesystem_root_and_a_path_under_a_file_are_refused():
    with pytest.raises(StoreError, match="the filesystem root cannot hold a run"):
        check(Path("/"), replace=True)
    with pytest.raises(StoreError, match="cannot write there"):
        check(Path(__file__) / "sub", replace=False)


def test_a_second_claim_is_refused_naming_the_holder_until_the_first_releases(tmp_path):
    first = claim(tmp_path / "out", replace=False)
    with pytest.raises(StoreError, match=rf"another run \(process {os.getpid()}\) is writing there"):
        claim(tmp_path / "out", replace=False)
    with pytest.raises(StoreError, match="another run"):
        save_run(NEW, INFO, tmp_path / "out")
    store_into(first, NEW, INFO)
    first.release()
    assert leftovers(tmp_path / "out") == []
    save_run(OLD, INFO, tmp_path / "out", replace=True)
    assert ids(tmp_path / "out") == [r.case_id for r in OLD]


def test_a_claim_refuses_a_run_that_another_writer_stored_after_the_check(tmp_path):
    """The check is repeated under the lock, and the publish refuses to replace what appeared since."""
    folder = claim(tmp_path / "out", replace=False)
    save_run(OLD, INFO, tmp_path / "elsewhere")
    shutil.copytree(tmp_path / "elsewhere", tmp_path / "out")  # a writer that ignores the lock
    with pytest.raises(StoreError, match="a stored run appeared there during the run"):
        store_into(folder, NEW, INFO)
    folder.release()
    assert ids(tmp_path / "out") == [r.case_id for r in OLD]


def test_free_space_and_the_file_size_limit_are_checked_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(StoreError, match="0.0 MiB free on its filesystem, and a run of this size may need 4.0 MiB"):
        save_run(NEW, INFO, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    monkeypatch.setattr(resource, "getrlimit", lambda which: (2**20, resource.RLIM_INFINITY))
    with pytest.raises(StoreError, match=r"files are limited to 1.0 MiB \(ulimit -f\)"):
        save_run(NEW, INFO, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
    assert estimated_bytes(10_000) > estimated_bytes(1) == estimated_bytes(0)


CHILD = r"""
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import reports.run_folder as run_folder
from reports import store
from test_reports_run_folder import INFO, NEW

stage = sys.argv[2]
def pause():
    print("PAUSED", flush=True)
    time.sleep(600)

if stage == "writing":  # the Parquet file written, the CSV half written
    def half_csv(records, path):
        Path(path).write_text("case_id,check\n")
        pause()
    store.write_csv = half_csv
elif stage in ("aside", "published"):
    renames = []
    real = os.rename
    def rename(src, dst):
        renames.append((src, dst))
        real(src, dst)
        if stage == "aside" and len(renames) == 1:  # the old run moved aside, the new one not yet in place
            pause()
    os.rename = rename
    real_rmtree = run_folder.shutil.rmtree
    def rmtree(path, ignore_errors=False):
        if stage == "published" and str(path).endswith(".old"):  # the new run in place, the old not removed
            pause()
        real_rmtree(path, ignore_errors=ignore_errors)
    run_folder.shutil.rmtree = rmtree
store.save_run(NEW, INFO, Path(sys.argv[1]), replace=True)
print("STORED", flush=True)
"""


def killed_at(stage: str, folder: Path) -> None:
    """Run a write of NEW over `folder` in a child, kill -9 it when it reaches `stage`."""
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(tests=str(ROOT / "tests")), str(folder), stage],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = child.stdout.readline()
        assert line == "PAUSED\n", line + child.stderr.read()
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("stage", ["writing", "aside", "published"])
def test_the_old_run_survives_a_kill_9_at_every_stage_of_a_write(tmp_path, stage):
    folder = old_run(tmp_path)
    killed_at(stage, folder)
    if stage == "aside":  # the old run waits aside; the folder says where, the next claim puts it back
        with pytest.raises(StoreError, match=r"left the previous one in .*\.out\.old"):
            load_run(folder)
        claim(folder, replace=True).release()
    survivor = NEW if stage == "published" else OLD
    assert ids(folder) == [r.case_id for r in survivor]
    claim(folder, replace=True).release()  # the dead writer's lock is free; its leftovers go
    assert leftovers(folder) == []
    save_run(NEW, INFO, folder, replace=True)
    assert ids(folder) == [r.case_id for r in NEW]


def test_a_kill_9_between_the_renames_of_a_run_into_a_new_folder_leaves_no_old_run(tmp_path):
    """Negative control of the recovery: with no old run, a killed write leaves the target absent,
    and nothing is invented."""
    killed_at("writing", tmp_path / "out")
    with pytest.raises(StoreError, match="not a directory, so no stored run$"):
        load_run(tmp_path / "out")
    claim(tmp_path / "out", replace=False).release()
    assert not (tmp_path / "out").exists() and leftovers(tmp_path / "out") == []


LIMITED = r"""
import resource, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from reports.records import Record
from reports.run_folder import StoreError, claim
from reports.store import store_into
from test_reports_run_folder import INFO, rec

resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
many = [rec(f"new/{{i:05d}}/" + "x" * 60) for i in range(2000)]  # some 400 KiB of CSV
with claim(Path(sys.argv[1]), replace=True, expected_bytes=1) as folder:  # an estimate that proves too small
    try:
        store_into(folder, many, INFO)
    except StoreError as exc:
        print(exc)
        sys.exit(2)
"""


def test_the_old_run_survives_a_file_size_limit_reached_mid_write(tmp_path):
    folder = old_run(tmp_path)
    result = subprocess.run([sys.executable, "-c", LIMITED.format(tests=str(ROOT / "tests")), str(folder)],
                            capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and "the run could not be stored (File too large" in lines[0], result.stdout
    assert "the folder is as it was" in lines[0] and result.stderr == ""
    assert ids(folder) == [r.case_id for r in OLD] and leftovers(folder) == []


def unwritable(path: Path) -> None:
    """Make `path` unwritable for this process: chattr +i as root (whom modes do not stop), else a mode."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available here, and root writes through any mode")
    else:
        path.chmod(0o555 if path.is_dir() else 0o444)


def writable(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.mark.parametrize("which", ["run.json", "folder", "parent"])
def test_an_unwritable_file_or_folder_is_refused_before_anything_is_written_and_the_old_run_loads(tmp_path, which):
    folder = old_run(tmp_path / "parent")
    path = {"run.json": folder / "run.json", "folder": folder, "parent": folder.parent}[which]
    unwritable(path)
    try:
        before = snapshot(tmp_path)
        with pytest.raises(StoreError, match="cannot write there|cannot be written"):
            save_run(NEW, INFO, folder, replace=True)
        assert snapshot(tmp_path) == before
        assert ids(folder) == [r.case_id for r in OLD]
    finally:
        writable(path)
    save_run(NEW, INFO, folder, replace=True)  # negative control: writable again, it is replaced
    assert ids(folder) == [r.case_id for r in NEW]


def test_a_failure_inside_the_write_removes_the_staging_folder_and_keeps_the_old_run(tmp_path):
    folder = old_run(tmp_path)

    def broken(staging: Path) -> None:
        (staging / "report.html").write_text("half")
        raise RuntimeError("the report renderer broke")

    with pytest.raises(RuntimeError, match="renderer broke"):
        save_run(NEW, INFO, folder, replace=True, also=broken)
    assert ids(folder) == [r.case_id for r in OLD] and leftovers(folder) == []


def test_a_claimed_folder_stores_its_run_and_is_released_by_its_context(tmp_path):
    with claim(tmp_path / "out", replace=False) as folder:
        store_into(folder, NEW, INFO)
        assert leftovers(tmp_path / "out") == [".out.lock"]
    assert ids(tmp_path / "out") == [r.case_id for r in NEW] and leftovers(tmp_path / "out") == []
    with pytest.raises(RuntimeError, match="the claim was released"):
        store_into(folder, NEW, INFO)
