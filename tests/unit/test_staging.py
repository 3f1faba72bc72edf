"""Staging inputs into the input directory: local paths, job outputs, URL fetchers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer.errors import ControlPlaneError, NotFoundError
from gpulayer.spec import InputRef
from gpulayer.worker.staging import (
    FetcherUnavailableError,
    InputMissingError,
    InputPathError,
    MachinePathRefusedError,
    StagingError,
    register_fetcher,
    stage_input,
    stage_inputs,
    unregister_fetcher,
    url_scheme,
)


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    source = tmp_path / "src"
    source.mkdir()
    return source, tmp_path / "input"


def ref(artifact: str, path: str) -> InputRef:
    return InputRef(artifact=artifact, path=path)


def test_relative_file_comes_from_the_source_dir(dirs: tuple[Path, Path]) -> None:
    source, input_dir = dirs
    (source / "cfg").mkdir()
    (source / "cfg" / "train.yaml").write_text("lr: 1")
    [staged] = stage_inputs(
        [ref("cfg/train.yaml", "conf/t.yaml")], input_dir, source_dir=source, machine_paths=True
    )
    assert staged.path == input_dir.resolve() / "conf" / "t.yaml"
    assert not staged.is_dir
    assert staged.path.read_text() == "lr: 1"


def test_absolute_directory_is_copied_with_links_followed(
    tmp_path: Path, dirs: tuple[Path, Path]
) -> None:
    source, input_dir = dirs
    data = tmp_path / "data"
    (data / "blobs").mkdir(parents=True)
    (data / "blobs" / "b1").write_text("blob")
    (data / "snap").mkdir()
    (data / "snap" / "weights.bin").symlink_to("../blobs/b1")
    [staged] = stage_inputs(
        [ref(str(data), "dataset")], input_dir, source_dir=source, machine_paths=True
    )
    assert staged.is_dir
    copied = input_dir / "dataset" / "snap" / "weights.bin"
    assert not copied.is_symlink()
    assert copied.read_text() == "blob"


def test_file_url(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    _, input_dir = dirs
    (tmp_path / "x.csv").write_text("a,b")
    stage_inputs([ref(f"file://{tmp_path / 'x.csv'}", "x.csv")], input_dir, machine_paths=True)
    assert (input_dir / "x.csv").read_text() == "a,b"


def test_job_refs_go_through_the_resolver(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    _, input_dir = dirs
    produced = tmp_path / "job-abc" / "out"
    produced.mkdir(parents=True)
    (produced / "model.bin").write_text("weights")
    asked = []

    def resolve(artifact: str) -> Path:
        asked.append(artifact)
        return produced

    stage_inputs([ref("job:abc/out", "prev")], input_dir, resolve_artifact=resolve)
    assert asked == ["job:abc/out"]
    assert (input_dir / "prev" / "model.bin").read_text() == "weights"


def test_job_ref_the_resolver_cannot_find_is_missing(dirs: tuple[Path, Path]) -> None:
    _, input_dir = dirs

    def resolve(artifact: str) -> Path:
        raise NotFoundError(f"job abc has no output {artifact.split('/', 1)[1]}")

    with pytest.raises(InputMissingError, match=r"inputs\[0\]\.artifact: 'job:abc/x': job abc"):
        stage_inputs([ref("job:abc/x", "x")], input_dir, resolve_artifact=resolve)


def test_job_ref_whose_control_plane_is_out_of_reach_is_not_a_staging_failure(
    dirs: tuple[Path, Path],
) -> None:
    # The attempt is lost with its control plane (and may retry), not failed by its input.
    _, input_dir = dirs

    def resolve(artifact: str) -> Path:
        raise ControlPlaneError("control plane at http://127.0.0.1:1 is unreachable")

    with pytest.raises(ControlPlaneError, match="unreachable"):
        stage_inputs([ref("job:abc/x", "x")], input_dir, resolve_artifact=resolve)
    assert list(input_dir.iterdir()) == []


def test_job_ref_without_a_resolver(dirs: tuple[Path, Path]) -> None:
    _, input_dir = dirs
    with pytest.raises(StagingError, match="needs a control plane") as caught:
        stage_inputs([ref("job:abc/x", "x")], input_dir)
    assert caught.value.reason == "setup_failed"


def test_missing_local_input_names_the_input(dirs: tuple[Path, Path]) -> None:
    source, input_dir = dirs
    (source / "present.txt").write_text("")
    inputs = [ref("present.txt", "a"), ref("absent.txt", "b")]
    with pytest.raises(InputMissingError, match=r"inputs\[1\]\.artifact: 'absent.txt'") as caught:
        stage_inputs(inputs, input_dir, source_dir=source, machine_paths=True)
    assert caught.value.reason == "input_missing"


def test_cloud_urls_are_fetched_by_their_providers_plugins() -> None:
    # Found through the entry-point group gpulayer.fetchers of the installed providers.
    from gpulayer_aws.fetch import fetch_s3
    from gpulayer_gcp.fetch import fetch_gs

    from gpulayer.worker.staging import _plugin_fetcher

    assert _plugin_fetcher("s3") is fetch_s3
    assert _plugin_fetcher("gs") is fetch_gs


def test_unknown_scheme(dirs: tuple[Path, Path]) -> None:
    _, input_dir = dirs
    with pytest.raises(FetcherUnavailableError, match="ftp:// artifacts cannot be fetched"):
        stage_inputs([ref("ftp://host/file", "f")], input_dir)


@pytest.fixture
def s3_fetcher() -> Iterator[list[tuple[str, Path]]]:
    calls: list[tuple[str, Path]] = []

    def fetch(url: str, dest: Path) -> None:
        calls.append((url, dest))
        if url.endswith("/missing"):
            raise FileNotFoundError(url)
        dest.write_text(f"fetched {url}")

    register_fetcher("S3", fetch)
    yield calls
    unregister_fetcher("s3")


def test_registered_fetcher_is_used(
    dirs: tuple[Path, Path], s3_fetcher: list[tuple[str, Path]]
) -> None:
    _, input_dir = dirs
    [staged] = stage_inputs([ref("s3://bucket/data.csv", "d/data.csv")], input_dir)
    assert s3_fetcher == [("s3://bucket/data.csv", staged.path)]
    assert staged.path.read_text() == "fetched s3://bucket/data.csv"
    with pytest.raises(InputMissingError):
        stage_inputs([ref("s3://bucket/missing", "m")], input_dir)


def test_a_link_put_there_by_an_earlier_input_cannot_lead_out(
    tmp_path: Path, dirs: tuple[Path, Path]
) -> None:
    _, input_dir = dirs
    outside = tmp_path / "outside"
    outside.mkdir()
    input_dir.mkdir()
    (input_dir / "escape").symlink_to(outside)
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputPathError, match="is not inside the input directory"):
        stage_input(
            ref(str(tmp_path / "f"), "escape/f"), input_dir, source_dir=None, resolve_artifact=None
        )
    assert list(outside.iterdir()) == []


def test_two_inputs_cannot_share_a_path(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    _, input_dir = dirs
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    with pytest.raises(InputPathError, match="already staged"):
        stage_inputs(
            [ref(str(tmp_path / "a"), "x"), ref(str(tmp_path / "b"), "x/")],
            input_dir,
            machine_paths=True,
        )
    with pytest.raises(InputPathError, match="cannot make its directory"):
        stage_inputs([ref(str(tmp_path / "b"), "x/y")], input_dir, machine_paths=True)


@pytest.mark.parametrize(
    ("artifact", "scheme"),
    [("s3://b/k", "s3"), ("GS://b", "gs"), ("/abs/path", None), ("rel/path", None), ("c:x", None)],
)
def test_url_scheme(artifact: str, scheme: str | None) -> None:
    assert url_scheme(artifact) == scheme


@pytest.mark.parametrize(
    "artifact", ["/etc/hostname", "file:///etc/hostname", "../../etc/hostname"]
)
def test_a_worker_for_other_machines_opens_no_path_of_its_own(
    artifact: str, dirs: tuple[Path, Path]
) -> None:
    source, input_dir = dirs
    with pytest.raises(MachinePathRefusedError, match=r"^inputs\[0\]\.artifact: ") as caught:
        stage_inputs([ref(artifact, "x")], input_dir, source_dir=source)
    assert caught.value.reason == "setup_failed"
    assert list(input_dir.iterdir()) == []
