"""s3:// job inputs, staged by gpulayer-aws's fetcher against moto's S3."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from gpulayer.spec import InputRef
from gpulayer.worker.staging import InputMissingError, stage_inputs
from tests.integration.aws.conftest import Moto
from tests.support.cli import run_cli
from tests.support.daemon import stop_local_control_plane


@pytest.fixture
def bucket(moto: Moto, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto.url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3 = boto3.client("s3", endpoint_url=moto.url, region_name="us-east-1")
    s3.create_bucket(Bucket="datasets")
    s3.put_object(Bucket="datasets", Key="train/a.csv", Body=b"x,y\n1,2\n")
    s3.put_object(Bucket="datasets", Key="train/nested/b.csv", Body=b"x,y\n3,4\n")
    s3.put_object(Bucket="datasets", Key="model.bin", Body=b"\x00\x01weights")
    return "datasets"


def test_an_object_and_a_prefix_are_staged(bucket: str, tmp_path: Path) -> None:
    inputs = [
        InputRef(artifact=f"s3://{bucket}/model.bin", path="model/weights.bin"),
        InputRef(artifact=f"s3://{bucket}/train/", path="data"),
        InputRef(artifact=f"s3://{bucket}/train", path="again"),  # a prefix without the slash
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
            [InputRef(artifact=f"s3://{bucket}/nothing-here", path="x")],
            tmp_path / "input",
            source_dir=None,
            resolve_artifact=None,
        )


def test_a_local_job_reads_an_s3_input(bucket: str, tmp_path: Path) -> None:
    script = (
        "import os; print(open(os.path.join(os.environ['GPULAYER_INPUT_DIR'], 'a.csv')).read())"
    )
    try:
        result = run_cli(
            ["submit", "--input", f"s3://{bucket}/train/a.csv:a.csv", "--", "python", "-c", script],
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        assert "1,2" in result.stdout
        job = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)[0]
        assert job["state"] == "succeeded"
    finally:
        import os

        stop_local_control_plane(Path(os.environ["GPULAYER_HOME"]))
