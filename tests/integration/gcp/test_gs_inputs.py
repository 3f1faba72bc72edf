"""gs:// job inputs, staged by gpulayer-gcp's fetcher against a Cloud Storage emulator that
runs as a server of its own."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer.spec import InputRef
from gpulayer.worker.staging import InputMissingError, stage_inputs
from tests.support.cli import run_cli
from tests.support.daemon import stop_local_control_plane
from tests.support.gcs_emulator import gcs_emulator


@pytest.fixture(scope="module")
def emulator_url() -> Iterator[str]:
    with gcs_emulator() as emulator:
        yield emulator.url


@pytest.fixture
def bucket(emulator_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator_url)
    client = storage.Client(project="lab")
    name = f"datasets-{os.getpid()}-{len(list(client.list_buckets()))}"
    made = client.create_bucket(name)
    made.blob("train/a.csv").upload_from_string(b"x,y\n1,2\n")
    made.blob("train/nested/b.csv").upload_from_string(b"x,y\n3,4\n")
    made.blob("model.bin").upload_from_string(b"\x00\x01weights")
    return name


def test_an_object_and_a_prefix_are_staged(bucket: str, tmp_path: Path) -> None:
    inputs = [
        InputRef(artifact=f"gs://{bucket}/model.bin", path="model/weights.bin"),
        InputRef(artifact=f"gs://{bucket}/train/", path="data"),
        InputRef(artifact=f"gs://{bucket}/train", path="again"),  # a prefix without the slash
    ]
    staged = stage_inputs(inputs, tmp_path / "input", source_dir=None, resolve_artifact=None)
    assert [s.is_dir for s in staged] == [False, True, True]
    assert (tmp_path / "input/model/weights.bin").read_bytes() == b"\x00\x01weights"
    assert (tmp_path / "input/data/a.csv").read_text() == "x,y\n1,2\n"
    assert (tmp_path / "input/data/nested/b.csv").read_text() == "x,y\n3,4\n"
    assert (tmp_path / "input/again/nested/b.csv").exists()


def test_a_missing_object_is_input_missing(bucket: str, tmp_path: Path) -> None:
    with pytest.raises(InputMissingError):
        stage_inputs(
            [InputRef(artifact=f"gs://{bucket}/nothing-here", path="x")],
            tmp_path / "input",
            source_dir=None,
            resolve_artifact=None,
        )
    assert not (tmp_path / "input" / "x").exists()


@pytest.mark.slow
def test_a_local_job_reads_a_gs_input(bucket: str, tmp_path: Path) -> None:
    script = (
        "import os; print(open(os.path.join(os.environ['GPULAYER_INPUT_DIR'], 'a.csv')).read())"
    )
    try:
        result = run_cli(
            ["submit", "--input", f"gs://{bucket}/train/a.csv:a.csv", "--", "python", "-c", script],
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        assert "1,2" in result.stdout
        job = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)[0]
        assert job["state"] == "succeeded"
    finally:
        stop_local_control_plane(Path(os.environ["GPULAYER_HOME"]))
