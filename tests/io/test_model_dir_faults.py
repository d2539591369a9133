"""What disks do to a model_dir: lost state file, killed saves, broken locks, a full disk (issue 14)."""

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time

import pytest

import helpers
import kerastrain as kt
from kerastrain.io import checkpoints
from kerastrain.cli import command as cli
from kerastrain.io import files
from kerastrain.io import locks

QUICKSTART = os.path.join(helpers.REPO, "recipes", "quickstart.yaml")


def trainer(model_dir, **kwargs):
    return kt.Trainer(helpers.build_model, helpers.global_batch_dataset_fn(), strategy="default",
                      seed=0, verbose=0, model_dir=model_dir, **kwargs)


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- 2. the state file ---------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["deleted", "emptied"])
def test_lost_state_file_resumes_at_the_right_step_and_overwrites_nothing(tmp_path, damage,
                                                                          caplog):
    t = trainer(tmp_path)
    t.fit(epochs=3)
    t.close()
    ckpts = tmp_path / "checkpoints"
    before = {p.name: digest(p) for p in ckpts.iterdir() if p.name.startswith("ckpt-")}
    assert {"ckpt-6.index", "ckpt-12.index", "ckpt-18.index"} <= set(before)
    if damage == "deleted":
        (ckpts / "checkpoint").unlink()
    else:
        (ckpts / "checkpoint").write_text("")
    with caplog.at_level(logging.INFO, logger="kerastrain"):
        resumed = trainer(tmp_path)
        resumed.fit(epochs=4)
    assert "rebuilt it from the 3 checkpoint(s) in that directory (ckpt-6, ckpt-12, ckpt-18)" \
        in caplog.text
    assert "resumed from" in caplog.text and "ckpt-18: step 18, after epoch 3 of 4" in caplog.text
    assert resumed.global_step == 24
    after = {p.name: digest(p) for p in ckpts.iterdir() if p.name.startswith("ckpt-")}
    for name in ("ckpt-12.index", "ckpt-18.index", "ckpt-12.data-00000-of-00001",
                 "ckpt-18.data-00000-of-00001"):
        assert after[name] == before[name], f"{name} was overwritten"
    # The rebuilt state file made them the manager's own: the oldest rotated out as usual.
    assert "ckpt-24.index" in after and "ckpt-6.index" not in after


def test_checkpoints_without_state_are_never_trained_over_if_unreadable(tmp_path):
    t = trainer(tmp_path)
    t.fit(epochs=1)
    t.close()
    (tmp_path / "checkpoints" / "checkpoint").unlink()
    data = tmp_path / "checkpoints" / "ckpt-6.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:50])
    with pytest.raises(RuntimeError, match="will not train over them"):
        trainer(tmp_path).fit(epochs=2)
    assert (tmp_path / "checkpoints" / "ckpt-6.index").exists()


# -- 5. what killed writes leave -------------------------------------------------------------

def test_leftovers_of_killed_writes_are_removed_at_start_and_only_those(tmp_path, caplog):
    t = trainer(tmp_path)
    t.fit(epochs=1)
    t.close()
    ckpts = tmp_path / "checkpoints"
    leftovers = [ckpts / "ckpt-7_temp" / "part-00000-of-00001.data-00000-of-00001.tempstate1",
                 ckpts / ("checkpoint.tmp" + "0123456789abcdef" * 2),
                 tmp_path / "export.kerastrain-partial-0123456789ab" / "model.keras",
                 tmp_path / ("config.yaml" + files.TMP_INFIX + "0123456789ab")]
    keep = [ckpts / "notes_temp", tmp_path / "export-mine" / "x", tmp_path / "config.yaml.tmp"]
    for path in leftovers + keep:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 1000)
    # A run killed between the two renames that replace export/: the previous one is put back.
    (tmp_path / "export").rename(tmp_path / "export.kerastrain-old-0123456789ab")
    with caplog.at_level(logging.INFO, logger="kerastrain"):
        trainer(tmp_path).close()
    for path in leftovers:
        top = path if path.parent in (ckpts, tmp_path) else path.parent
        assert not top.exists(), top
    for path in keep:
        assert path.exists(), path
    assert "removed what interrupted writes left" in caplog.text
    assert (tmp_path / "export" / "model.keras").exists()
    assert checkpoints.export_is_current(str(tmp_path / "export"), 6)


# -- 6. the lock ---------------------------------------------------------------------------

@pytest.mark.parametrize("content", ["", "\x00\x00garbage{", '{"host": "?", "pid": '])
def test_an_empty_or_garbage_lock_file_is_stale(tmp_path, content, caplog):
    (tmp_path / locks.NAME).write_text(content)
    with caplog.at_level(logging.WARNING, logger="kerastrain"):
        t = trainer(tmp_path)
    assert "no process holds it, so this run takes it over" in caplog.text
    assert json.loads((tmp_path / locks.NAME).read_text())["pid"] == os.getpid()
    t.close()
    assert not (tmp_path / locks.NAME).exists()


def test_a_new_model_dir_takes_its_lock_without_a_word(tmp_path, caplog):
    # The lock file this run creates is empty until it writes its record: that is not stale.
    with caplog.at_level(logging.DEBUG, logger="kerastrain"):
        lock = locks.ModelDirLock(str(tmp_path / "new")).acquire()
    assert "lock" not in caplog.text, caplog.text
    assert json.loads((tmp_path / "new" / locks.NAME).read_text())["pid"] == os.getpid()
    lock.release()


TAKER = """
import json, os, sys, time
from kerastrain.io import locks
model_dir, go, done = sys.argv[1:4]
while not os.path.exists(go):
    time.sleep(0.001)
try:
    locks.ModelDirLock(model_dir).acquire()
    result = "owner"
except locks.ModelDirInUse:
    result = "refused"
print(json.dumps({"result": result, "tensorflow": "tensorflow" in sys.modules}), flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(done) and time.monotonic() < deadline:
    time.sleep(0.01)  # hold it until every process has tried
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize("stale", ["dead pid", "empty", "garbage"])
def test_twenty_simultaneous_takeovers_leave_exactly_one_owner(tmp_path, stale):
    import socket
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = tmp_path / "run" / locks.NAME
    lock.parent.mkdir()
    lock.write_text({"dead pid": json.dumps({"host": socket.gethostname(), "pid": dead.pid,
                                             "since": time.time()}),
                     "empty": "", "garbage": "{{{"}[stale])
    go, done = tmp_path / "go", tmp_path / "done"
    env = helpers.child_env()
    procs = [subprocess.Popen([sys.executable, "-c", TAKER, str(lock.parent), str(go), str(done)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(20)]
    try:
        time.sleep(1.0)  # let them all start and wait at the line
        go.touch()
        results = [json.loads(p.stdout.readline() or "{}") for p in procs]
    finally:
        done.touch()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    assert [r.get("result") for r in results].count("owner") == 1, results
    assert [r.get("result") for r in results].count("refused") == 19, results
    assert not any(r["tensorflow"] for r in results)  # the lock is light: no TensorFlow


# -- 4. a full disk ------------------------------------------------------------------------

@pytest.fixture
def tiny_disk():
    """A 4 MiB tmpfs (needs root, as in CI); removed afterwards. Not under /tmp: while a file
    system is mounted beneath /tmp, Linux refuses the multihost rehearsal's /tmp overlay
    (tests/cli/test_hosts.py runs beside this)."""
    import tempfile
    from pathlib import Path
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs the tests as root)")
    path = Path(tempfile.mkdtemp(prefix="kerastrain-tiny-disk-", dir="/var/tmp"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(path)],
                             capture_output=True, text=True, timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)
        shutil.rmtree(path, ignore_errors=True)


def fill(disk):
    """Fill the disk to the last byte."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)


def filling_at(hook, when=lambda *a: True, disk=None):
    import keras
    return keras.callbacks.LambdaCallback(**{hook: lambda *a: when(*a) and fill(disk)})


def _listed(state_file, name):
    """Whether TensorFlow's state file lists checkpoint `name` (a save is whole once listed)."""
    return state_file.exists() and f'"{name}"' in state_file.read_text()


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
def test_a_full_disk_during_a_checkpoint_save_is_one_line_and_loses_nothing(tiny_disk,
                                                                           background):
    """The disk fills once ckpt-6 is whole; the save of step 12 fails. Written in the
    background, the failure is raised by the next save or the end of training, for its step."""
    run = tiny_disk / "run"
    t = trainer(run, tensorboard=False, checkpoint={"background": background})
    state = run / "checkpoints" / "checkpoint"

    def second_epoch(epoch, logs):
        if epoch != 1:
            return False
        deadline = time.monotonic() + 60
        while not _listed(state, "ckpt-6"):   # a background write: once it is whole
            assert time.monotonic() < deadline, "ckpt-6 was never written"
            time.sleep(0.01)
        return True
    with pytest.raises(files.DiskFull) as e:
        t.fit(epochs=3, callbacks=[filling_at("on_epoch_begin", second_epoch, tiny_disk)])
    assert t._state.run.checkpointer.background is background
    message = str(e.value)
    assert "\n" not in message and message.startswith(
        f"disk full: could not write the checkpoint of step 12 to {run / 'checkpoints'} (")
    assert "free of 4.0 MiB" in message and "ckpt-6" in message and "intact" in message
    t.close()
    import tensorflow as tf
    assert tf.train.latest_checkpoint(str(run / "checkpoints")).endswith("ckpt-6")
    assert tf.train.load_checkpoint(str(run / "checkpoints" / "ckpt-6"))  # still readable
    (tiny_disk / "filler").unlink()
    resumed = trainer(run, tensorboard=False)
    resumed.fit(epochs=3)
    assert resumed.global_step == 18
    assert not [n for n in os.listdir(run / "checkpoints") if "_temp" in n]
    resumed.close()


def test_a_full_disk_during_export_keeps_the_previous_one_and_the_next_run_repairs_it(
        tiny_disk):
    import keras
    run = tiny_disk / "run"
    t = trainer(run, tensorboard=False)
    t.fit(epochs=1)
    t.close()
    assert checkpoints.export_is_current(str(run / "export"), 6)
    before = {p.relative_to(run): digest(p) for p in (run / "export").rglob("*") if p.is_file()}
    t = trainer(run, tensorboard=False)
    with pytest.raises(files.DiskFull) as e:
        t.fit(epochs=2, callbacks=[filling_at("on_train_end", disk=tiny_disk)])
    t.close()
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"disk full: could not write the export to {run / 'export'}")
    assert "the previous export is intact" in str(e.value)
    after = {p.relative_to(run): digest(p) for p in (run / "export").rglob("*") if p.is_file()}
    assert after == before
    assert sorted(os.listdir(run)) == ["checkpoints", "config.yaml", "export"]  # no partials
    keras.models.load_model(run / "export" / "model.keras")
    (tiny_disk / "filler").unlink()
    repaired = trainer(run, tensorboard=False)
    repaired.fit(epochs=2)  # nothing left to train: it only writes the export again
    repaired.close()
    assert repaired.global_step == 12
    assert checkpoints.export_is_current(str(run / "export"), 12)
    keras.models.load_model(run / "export" / "model.keras")


def test_the_cli_says_disk_full_in_one_line_and_exits_1(tiny_disk, capsys):
    fill(tiny_disk)
    code = cli.main(["run", QUICKSTART, "--set", f"trainer.model_dir={tiny_disk / 'run'}",
                     "--set", "trainer.epochs=1", "--set", "trainer.steps_per_epoch=2",
                     "--set", "data.train.args.num_examples=256", "--set",
                     "data.validation.args.num_examples=128", "--set", "strategy=default"])
    err = capsys.readouterr().err
    assert code == 1, err
    lines = [line for line in err.splitlines() if "disk full" in line]
    assert len(lines) == 1 and lines[0].startswith("kerastrain: disk full: could not write "), err
    assert "Traceback" not in err
    # The empty lock file that start left is stale for the next run, once there is room.
    (tiny_disk / "filler").unlink()
    t = trainer(tiny_disk / "run")
    t.close()


def test_a_killed_workers_scratch_copy_is_removed_by_the_next_one(tmp_path, monkeypatch):
    """A multi-worker non-chief writes its part of each save to a scratch directory in the
    temp dir, removed at once; killed during a save it leaves one model's worth there. The next
    scratch directory removes those of processes that are gone, and only those."""
    import tempfile

    from kerastrain.io import outputs
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = tmp_path / f"kerastrain-nonchief-{int(gone.stdout)}-abc123"
    (dead / "ckpt_temp").mkdir(parents=True)
    (dead / "ckpt_temp" / "part-00000").write_bytes(b"\0" * 1024)
    alive = tmp_path / f"kerastrain-nonchief-{os.getppid()}-def456"   # pytest's parent: alive
    alive.mkdir()
    unknown = tmp_path / "kerastrain-nonchief-3mwd35jv"   # before names carried a pid
    unknown.mkdir()
    with outputs.scratch_dir() as path:
        assert os.path.basename(path).startswith(f"kerastrain-nonchief-{os.getpid()}-")
        assert not dead.exists() and alive.exists() and unknown.exists()
    assert not os.path.exists(path)
