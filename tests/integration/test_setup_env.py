"""A job's ``setup`` on a real runner: commands, then packages installed by uv from a package
index served here, into an environment reused by the next job asking for the same."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer.protocol.bundle import create_bundle
from gpulayer.worker.runner import JobRun, RunContext, RunOutcome
from gpulayer.worker.setup_env import SETUP_PREFIX, uv_binary
from tests.integration.test_runner import Logs, py
from tests.support.package_index import PackageIndex, make_wheel

pytestmark = pytest.mark.skipif(uv_binary() is None, reason="uv is not installed")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackageIndex]:
    wheels = tmp_path_factory.mktemp("wheels")
    make_wheel(wheels, "gltest-greeting", "1.0", {"gltest_greeting.py": "WORDS = 'hello 1.0'\n"})
    make_wheel(wheels, "gltest-greeting", "2.0", {"gltest_greeting.py": "WORDS = 'hello 2.0'\n"})
    with PackageIndex(wheels) as served:
        yield served


def _run(spec: Any, tmp_path: Path, cache: Path, logs: Logs, **ctx: Any) -> RunOutcome:
    context = RunContext(
        job_id=ctx.pop("job_id", "job-1"),
        attempt=1,
        spec=spec,
        job_dir=ctx.pop("job_dir", tmp_path / "attempt"),
        setup_cache=cache,
        **ctx,
    )
    return JobRun(context, logs).run()


def _setup_lines(logs: Logs) -> list[str]:
    return [t for s, t in logs.chunks if s == "system" and t.startswith(SETUP_PREFIX)]


def test_packages_are_installed_once_and_the_job_runs_with_them(
    index: PackageIndex, tmp_path: Path
) -> None:
    cache = tmp_path / "envs"
    setup = {"pip": ["gltest-greeting==1.0"], "index_url": index.url}
    code = "import gltest_greeting, sys; print(gltest_greeting.WORDS, sys.prefix)"
    first_logs = Logs()
    first = _run(py(code, setup=setup), tmp_path, cache, first_logs, job_dir=tmp_path / "a")
    assert first.state == "succeeded", first_logs.all_text()
    assert first_logs.text("stdout").startswith("hello 1.0 ")
    prefix = first_logs.text("stdout").split()[-1]
    assert Path(prefix).parent == cache  # the job's interpreter is the setup's environment
    assert any("installing gltest-greeting==1.0" in line for line in _setup_lines(first_logs))
    fetched = list(index.downloads)
    assert set(fetched) == {"gltest_greeting-1.0-py3-none-any.whl"}

    again_logs = Logs()
    again = _run(py(code, setup=setup), tmp_path, cache, again_logs, job_dir=tmp_path / "b")
    assert again.state == "succeeded", again_logs.all_text()
    assert again_logs.text("stdout").split()[-1] == prefix
    assert any("reusing environment" in line for line in _setup_lines(again_logs))
    assert index.downloads == fetched  # nothing fetched again

    other_logs = Logs()
    other_setup = {"pip": ["gltest-greeting==2.0"], "index_url": index.url}
    other = _run(py(code, setup=other_setup), tmp_path, cache, other_logs, job_dir=tmp_path / "c")
    assert other.state == "succeeded", other_logs.all_text()
    assert other_logs.text("stdout").startswith("hello 2.0 ")
    assert other_logs.text("stdout").split()[-1] != prefix


def test_the_job_sees_the_workers_packages_after_its_own(
    index: PackageIndex, tmp_path: Path
) -> None:
    setup = {"pip": ["gltest-greeting==1.0"], "index_url": index.url}
    logs = Logs()
    outcome = _run(
        py("import gpulayer, gltest_greeting; print('both')", setup=setup),
        tmp_path,
        tmp_path / "envs",
        logs,
    )
    assert outcome.state == "succeeded", logs.all_text()
    assert logs.text("stdout") == "both\n"


def test_a_package_the_index_lacks_fails_setup_naming_it(
    index: PackageIndex, tmp_path: Path
) -> None:
    logs = Logs()
    setup = {"pip": ["gltest-no-such-package==3.1"], "index_url": index.url}
    outcome = _run(py("print('never')", setup=setup), tmp_path, tmp_path / "envs", logs)
    assert (outcome.state, outcome.reason) == ("failed", "setup_failed")
    assert outcome.message is not None and "gltest-no-such-package" in outcome.message
    assert "never" not in logs.text("stdout")
    assert not any((tmp_path / "envs").glob("*/bin/python"))  # no half-built environment kept


def test_requirements_file_comes_from_the_source(index: PackageIndex, tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "requirements.txt").write_text("gltest-greeting==2.0\n")
    (source / "main.py").write_text("import gltest_greeting\nprint(gltest_greeting.WORDS)\n")
    bundle = tmp_path / "source.tar.gz"
    create_bundle(source, bundle)
    logs = Logs()
    spec = py(
        "import runpy; runpy.run_path('main.py')",
        setup={"requirements_file": "requirements.txt", "index_url": index.url},
    )
    outcome = _run(spec, tmp_path, tmp_path / "envs", logs, bundle=bundle)
    assert outcome.state == "succeeded", logs.all_text()
    assert logs.text("stdout") == "hello 2.0\n"


def test_commands_run_first_in_order_and_a_failing_one_stops_the_job(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    logs = Logs()
    setup = {"commands": [["sh", "-c", f"echo one >> {marker}"], ["sh", "-c", f"echo two >> {marker}"]]}
    ok = _run(py(f"print(open({str(marker)!r}).read().split())", setup=setup), tmp_path, tmp_path / "e", logs)
    assert ok.state == "succeeded", logs.all_text()
    assert logs.text("stdout") == "['one', 'two']\n"

    failing_logs = Logs()
    failing = {"commands": [["sh", "-c", "echo broken-step >&2; exit 4"]]}
    outcome = _run(
        py("print('never')", setup=failing), tmp_path, tmp_path / "e", failing_logs,
        job_dir=tmp_path / "b",
    )
    assert (outcome.state, outcome.reason) == ("failed", "setup_failed")
    assert outcome.message is not None
    assert "exit 4" in outcome.message and "broken-step" in outcome.message
    assert any("broken-step" in line for line in _setup_lines(failing_logs))


def test_setup_has_a_time_limit(tmp_path: Path) -> None:
    logs = Logs()
    setup = {"commands": [["sleep", "60"]], "timeout_seconds": 1}
    outcome = _run(py("print('never')", setup=setup), tmp_path, tmp_path / "e", logs)
    assert (outcome.state, outcome.reason) == ("failed", "setup_failed")
    assert outcome.message is not None and "setup timed out after 1 s" in outcome.message


def test_cancel_during_setup_ends_it(tmp_path: Path) -> None:
    logs = Logs()
    setup = {"commands": [["sh", "-c", "echo setup-waiting; exec sleep 60"]]}
    started = threading.Event()
    context = RunContext(
        job_id="job-1",
        attempt=1,
        spec=py("print('never')", setup=setup),
        job_dir=tmp_path / "attempt",
        setup_cache=tmp_path / "e",
    )
    run = JobRun(context, logs)
    logs.on("setup-waiting", lambda: (started.set(), run.cancel()), stream="system")
    outcome = run.run()
    assert started.is_set()
    assert (outcome.state, outcome.reason) == ("cancelled", "cancelled")
