"""Checkpointer: atomic saves, verification on restore, pruning, asynchronous saves."""

from __future__ import annotations

import collections
import json
import logging
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gpuguard.training import CHECKPOINT_DIR_ENV, Checkpointer, CheckpointError
from gpuguard.training.serialization import StagingArea, prepare


def state_at(step: int) -> dict:
    return {
        "weights": np.full((64, 32), float(step)),
        "bias": np.arange(8, dtype=np.float32) + step,
        "epoch": step // 10,
        "note": f"state of step {step}",
    }


def payload_of(checkpointer: Checkpointer, step: int) -> Path:
    manifest = json.loads((checkpointer.directory / f"step-{step:012d}.json").read_text())
    return checkpointer.directory / manifest["payload"]


def test_restore_returns_the_newest_checkpoint_with_its_state(tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=5)
    for step in (10, 20, 30):
        checkpointer.save(step, state_at(step))

    restored = Checkpointer(tmp_path).restore()

    assert restored is not None
    assert restored.step == 30
    assert np.array_equal(restored.state["weights"], state_at(30)["weights"])
    assert restored.state["bias"].dtype == np.float32
    assert restored.state["note"] == "state of step 30"
    manifest = json.loads(restored.manifest.read_text())
    assert manifest["step"] == 30
    assert manifest["serializer"] == "pickle"
    assert len(manifest["sha256"]) == 64


def test_an_empty_directory_has_nothing_to_restore(tmp_path):
    assert Checkpointer(tmp_path / "new").restore() is None


def test_keeps_the_last_n_and_nothing_else(tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=2)
    for step in range(1, 6):
        checkpointer.save(step, state_at(step))

    assert checkpointer.steps() == [4, 5]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in names if n.endswith(".json")] == [
        "step-000000000004.json",
        "step-000000000005.json",
    ]
    assert sorted(n for n in names if n.endswith(".pkl")) == sorted(
        [payload_of(checkpointer, 4).name, payload_of(checkpointer, 5).name]
    )
    assert not [n for n in names if n.startswith(".tmp-")]


def test_a_corrupted_checkpoint_is_skipped_with_a_warning(tmp_path, caplog):
    checkpointer = Checkpointer(tmp_path, keep=3)
    checkpointer.save(10, state_at(10))
    checkpointer.save(20, state_at(20))
    payload = payload_of(checkpointer, 20)
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, where the arrays are
    payload.write_bytes(bytes(data))

    with caplog.at_level(logging.WARNING, logger="gpuguard.training"):
        restored = Checkpointer(tmp_path).restore()

    assert restored is not None and restored.step == 10
    assert np.array_equal(restored.state["weights"], state_at(10)["weights"])
    assert "step-000000000020.json" in caplog.text
    assert "does not match its SHA-256 checksum" in caplog.text


def test_a_truncated_checkpoint_is_skipped(tmp_path, caplog):
    checkpointer = Checkpointer(tmp_path, keep=3)
    checkpointer.save(10, state_at(10))
    checkpointer.save(20, state_at(20))
    payload = payload_of(checkpointer, 20)
    payload.write_bytes(payload.read_bytes()[:1000])

    with caplog.at_level(logging.WARNING, logger="gpuguard.training"):
        restored = Checkpointer(tmp_path).restore()

    assert restored is not None and restored.step == 10
    assert "has 1000 bytes, the manifest says" in caplog.text


class _Tripwire:
    """Unpickling this touches a file: proof that a payload was loaded."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_payload_that_does_not_verify_is_never_loaded(tmp_path):
    checkpointer = Checkpointer(tmp_path / "ckpt")
    checkpointer.save(10, state_at(10))
    checkpointer.save(20, state_at(20))
    marker = tmp_path / "loaded"
    payload = payload_of(checkpointer, 20)
    replacement = pickle.dumps(_Tripwire(str(marker)), protocol=5)
    payload.write_bytes(replacement.ljust(payload.stat().st_size, b"\0"))  # same size

    restored = Checkpointer(tmp_path / "ckpt").restore()

    assert restored is not None and restored.step == 10
    assert not marker.exists()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda m: m.write_text("{not json"), "not valid JSON"),
        (lambda m: m.write_text(json.dumps({"format": "other"})), "format"),
        (
            lambda m: m.write_text(json.dumps({**json.loads(m.read_text()), "step": 11})),
            "its step does not match the file name",
        ),
        (
            lambda m: m.write_text(json.dumps({**json.loads(m.read_text()), "payload": "../x"})),
            "payload does not name a payload file of this step",
        ),
        (
            lambda m: m.write_text(json.dumps({**json.loads(m.read_text()), "sha256": "x"})),
            "sha256 is not a SHA-256 digest",
        ),
    ],
)
def test_a_bad_manifest_is_skipped_and_named(tmp_path, caplog, damage, message):
    checkpointer = Checkpointer(tmp_path, keep=3)
    checkpointer.save(5, state_at(5))
    checkpointer.save(20, state_at(20))
    damage(tmp_path / "step-000000000020.json")

    with caplog.at_level(logging.WARNING, logger="gpuguard.training"):
        restored = Checkpointer(tmp_path).restore()

    assert restored is not None and restored.step == 5
    assert message in caplog.text


def test_a_missing_payload_is_skipped_and_all_bad_gives_none(tmp_path, caplog):
    checkpointer = Checkpointer(tmp_path, keep=3)
    checkpointer.save(1, state_at(1))
    payload_of(checkpointer, 1).unlink()

    with caplog.at_level(logging.WARNING, logger="gpuguard.training"):
        assert Checkpointer(tmp_path).restore() is None
    assert "is missing" in caplog.text


def test_pruning_after_a_skipped_checkpoint_keeps_the_good_ones(tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=2)
    checkpointer.save(10, state_at(10))
    checkpointer.save(20, state_at(20))
    payload_of(checkpointer, 20).write_bytes(b"garbage")

    resumed = Checkpointer(tmp_path, keep=2)
    assert resumed.restore().step == 10
    resumed.save(11, state_at(11))  # the unreadable 20 goes first, not the good 10

    assert resumed.steps() == [10, 11]
    assert Checkpointer(tmp_path).restore().step == 11


def test_saving_a_step_again_replaces_it(tmp_path):
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(7, state_at(7))
    first_payload = payload_of(checkpointer, 7)
    checkpointer.save(7, {**state_at(7), "note": "again"})

    assert not first_payload.exists()
    assert Checkpointer(tmp_path).restore().state["note"] == "again"


def test_leftovers_of_an_interrupted_save_go_with_the_next_save_not_before(tmp_path):
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(1, state_at(1))
    partial = tmp_path / ".tmp-0123456789ab-step-000000000002.0badf00d.pkl"
    partial.write_bytes(b"partial")
    orphan = tmp_path / "step-000000000002.0badf00d.pkl"  # renamed, manifest never written
    orphan.write_bytes(b"complete but never committed")

    resumed = Checkpointer(tmp_path)
    assert resumed.restore().step == 1
    assert partial.exists()  # a reader changes nothing: it may be another rank's save
    resumed.save(3, state_at(3))
    assert not partial.exists()
    assert not orphan.exists()


def test_a_failed_save_raises_and_leaves_no_trace(tmp_path):
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(1, state_at(1))

    with pytest.raises(CheckpointError, match="saving step 2"):
        checkpointer.save(2, {"weights": np.zeros(3), "callback": lambda: None})

    assert checkpointer.steps() == [1]
    assert not list(tmp_path.glob(".tmp-*"))


def test_the_directory_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(CHECKPOINT_DIR_ENV, raising=False)
    with pytest.raises(CheckpointError, match=CHECKPOINT_DIR_ENV):
        Checkpointer()
    monkeypatch.setenv(CHECKPOINT_DIR_ENV, str(tmp_path / "from-env"))
    Checkpointer().save(3, state_at(3))
    assert Checkpointer(tmp_path / "from-env").steps() == [3]


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="keep=0"):
        Checkpointer(tmp_path, keep=0)
    with pytest.raises(CheckpointError, match=r"step 1\.5: a checkpoint step is an integer"):
        Checkpointer(tmp_path).save(1.5, state_at(1))
    with pytest.raises(CheckpointError, match="step -1"):
        Checkpointer(tmp_path).save(-1, state_at(1))
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match=r"checkpoint directory .*file"):
        Checkpointer(tmp_path / "file")


def test_a_numpy_integer_step_is_fine(tmp_path):
    Checkpointer(tmp_path).save(np.int64(12), state_at(12))
    assert Checkpointer(tmp_path).restore().step == 12


def test_a_checkpoint_needing_a_missing_library_is_an_error_not_a_skip(tmp_path, monkeypatch):
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(1, state_at(1))
    checkpointer.save(2, state_at(2))
    manifest = tmp_path / "step-000000000002.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "serializer": "torch"}))
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails, as without torch

    with pytest.raises(CheckpointError, match=r"cannot load .*step-000000000002\.json"):
        Checkpointer(tmp_path).restore()


def test_an_asynchronous_save_writes_the_state_as_it_was_when_saved(tmp_path):
    checkpointer = Checkpointer(tmp_path, asynchronous=True)
    big = np.arange(9_000_000, dtype=np.float64)  # 72 MB: copied in chunks by threads
    state = {**state_at(1), "big": big, "strided": np.arange(100.0)[::3]}
    checkpointer.save(1, state)
    state["weights"] += 100.0  # training goes on while the save is written
    state["bias"][:] = -1
    big[-5:] = -1
    checkpointer.wait()
    assert not checkpointer.saving
    saved = Checkpointer(tmp_path).restore().state
    assert np.array_equal(saved["weights"], state_at(1)["weights"])
    assert np.array_equal(saved["big"], np.arange(9_000_000, dtype=np.float64))
    assert np.array_equal(saved["strided"], np.arange(100.0)[::3])

    checkpointer.save(2, state)  # the staging buffers are reused: they must be refreshed
    checkpointer.close()
    restored = Checkpointer(tmp_path).restore()
    assert restored.step == 2
    for name in ("weights", "bias", "big"):
        assert np.array_equal(restored.state[name], state[name])


def test_a_background_failure_surfaces_on_the_next_call_and_keeps_the_last_good(tmp_path):
    checkpointer = Checkpointer(tmp_path, asynchronous=True)
    checkpointer.save(1, state_at(1))
    checkpointer.save(2, {"weights": np.zeros(3), "callback": lambda: None})  # fails in the writer

    with pytest.raises(CheckpointError, match=r"saving step 2 .* failed in the background"):
        checkpointer.save(3, state_at(3))
    assert Checkpointer(tmp_path).restore().step == 1
    checkpointer.save(3, state_at(3))
    checkpointer.close()
    assert Checkpointer(tmp_path).restore().step == 3


def test_staging_copies_leaves_and_keeps_container_types(tmp_path):
    ordered = collections.OrderedDict(w=np.ones(3))
    ordered._metadata = {"": {"version": 2}}  # what a torch state_dict carries
    Point = collections.namedtuple("Point", "x y")
    state = {"model": ordered, "point": Point(np.zeros(2), [1, 2]), "extra": {"k": [np.ones(1)]}}

    staged = prepare(state, StagingArea()).state
    unstaged = prepare(state, None).state

    assert type(staged["model"]) is collections.OrderedDict
    assert staged["model"]._metadata == {"": {"version": 2}}
    assert isinstance(staged["point"], Point)
    assert staged["model"]["w"] is not ordered["w"]
    assert staged["point"].y is not state["point"].y
    assert unstaged["model"]["w"] is ordered["w"]


_KILLED_WRITER = """
import sys, numpy as np
from gpuguard.training import Checkpointer
checkpointer = Checkpointer(sys.argv[1], keep=2)
for step in range(1, 10_000):
    checkpointer.save(step, {"weights": np.full(2_000_000, float(step))})
    print(step, flush=True)
"""


def test_a_writer_killed_at_random_moments_always_leaves_a_good_checkpoint(tmp_path):
    rng = random.Random(5)
    for attempt in range(4):
        writer = subprocess.Popen(
            [sys.executable, "-c", _KILLED_WRITER, str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout.readline()  # one checkpoint done, more in progress
        time.sleep(rng.uniform(0, 0.2))
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()

        restored = Checkpointer(tmp_path, keep=2).restore()
        assert restored is not None, f"attempt {attempt}"
        assert np.all(restored.state["weights"] == float(restored.step))
