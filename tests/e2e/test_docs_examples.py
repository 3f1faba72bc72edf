"""Every shell and Python example in the manual (README.md, docs/*.md) runs here, as written.

Each ```bash / ```python block carries `<!-- example: NAME -->` on the line above it. The fast
test below fails when a block has no marker, when two share a name, or when this file's registry
names an example the pages no longer have (or misses one they have). The slow tests run each
example's command lines in order, comments dropped, as a new user would: a fresh HOME, a project
folder holding the files the examples name (a train.py that prints, a job.yaml, ...), and the
on-demand local control plane. Placeholders (JOB, ...) are replaced by the values this run has,
from a small table beside each test. Where an example asks for a GPU or a cloud this machine does
not have, the test checks the answer a machine without them gets (the plan's refusal names why).

Not run, and checked statically instead: install and CI commands (they reach package indexes
beyond loopback, or are CI itself), listed in STATIC with why. NOT_YET_RUN lists what is still
to do, with why.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support import doc_examples
from tests.support.aws_env import without_aws_credentials
from tests.support.doc_examples import ROOT, Example
from tests.support.doc_reader import Reader, Run, run_example
from tests.support.servers import free_port, postgres_cluster
from tests.support.sshd_hosts import HostFactory, SshdLab, ssh_hosts, sshd_lab

TRY_WITHOUT_CLOUD = "tests/e2e_cloud/test_readme_try_without_cloud.py"

# Which test runs each example. An example added to a page without an entry here fails the
# fast test, and so does an entry whose example is gone.
RUN_HERE: dict[str, str] = {
    "readme-install": "test_first_job",
    "readme-first-steps": "test_first_job",
    "index-install": "test_first_job",
    "index-first-steps": "test_first_job",
    "jobs-submit-and-inspect": "test_jobs_page",
    "jobs-delete-prune": "test_jobs_page",
    "jobs-validate": "test_jobs_page",
    "jobs-server": "test_jobs_page",
    "team-server-setup": "test_team_server_page",
    "team-server-secrets": "test_team_server_secrets",
    "targets-plan": "test_targets_offers_and_cloud_commands",
    "offers-listing": "test_targets_offers_and_cloud_commands",
    "clouds-commands": "test_targets_offers_and_cloud_commands",
    "schedules-commands": "test_schedule_commands",
    "schedule-commands": "test_schedule_commands",
    "schedules-sdk": "test_schedules_sdk",
    "sdk-map": "test_sdk_map",
    "sdk-tour": "test_sdk_tour",
    "clouds-instances": "test_sdk_tour",
    "multi-node-trainer": "test_multi_node_trainer",
    "multi-node-command-submit": "test_multi_node_command",
    "multi-node-command-launch": "test_multi_node_command",
    "dashboard-ui": "test_dashboard_login_links",
    "readme-ci": "test_install_and_ci_commands_name_what_the_repository_has",
    "readme-lock-update": "test_install_and_ci_commands_name_what_the_repository_has",
}
# Run by a test of their own elsewhere: the try-without-a-cloud steps against a lab sshd host.
RUN_ELSEWHERE: dict[str, str] = {
    "jobspec-attach": "tests/e2e_cloud/test_cloud_attach.py",
    "clouds-try-ssh-setup": TRY_WITHOUT_CLOUD,
    "clouds-try-ssh-run": TRY_WITHOUT_CLOUD,
}
# (example, command or `&&` part) -> why it is checked statically rather than run.
STATIC: dict[tuple[str, str], str] = {
    ("readme-install", "pip install -e ."): "reaches the package index; CI installs from the lock",
    ("index-install", "pip install -e ."): "reaches the package index; CI installs from the lock",
    ("readme-ci", "bash .ci/run"): "it is CI itself (and installs from the package index)",
    (
        "readme-lock-update",
        "uv pip compile .ci/dev.in --python-version 3.10 --universal --no-header -o .ci/dev.lock",
    ): "resolves against the package index",
    ("clouds-try-ssh-setup", "sudo apt-get install -y openssh-server"): (
        "reaches Debian's mirrors; the lab's hosts come with sshd (the package CI installs)"
    ),
    ("clouds-try-ssh-setup", "sudo service ssh start"): (
        "starts this machine's own sshd as a service; a lab host's sshd stands in for it"
    ),
}
# Examples (or single lines of one) not run yet, each with why.
NOT_YET_RUN: dict[tuple[str, str | None], str] = {
    ("clouds-commands", "gpulayer catalog refresh aws"): (
        "its default source is AWS's Pricing API, which moto does not serve; the bulk price "
        "list (--source bulk) is run against a local server by tests/unit/test_aws_catalog.py"
    ),
    ("clouds-commands", "gpulayer catalog refresh gcp"): (
        "reads the Cloud Billing Catalog API, for which the lab has no stand-in that answers "
        "(tests/e2e/test_cloud_wait_cli.py only checks it gives a silent one up)"
    ),
}

__all__ = ["ssh_hosts", "sshd_lab"]  # the lab's sshd hosts, as fixtures here

EXAMPLES = doc_examples.scan()


def example(name: str) -> Example:
    return EXAMPLES.by_name()[name]


def _not_yet(name: str) -> dict[str, str]:
    return {line: why for (ex, line), why in NOT_YET_RUN.items() if ex == name and line}


# -- the fast checks ------------------------------------------------------------------------------


def test_every_runnable_block_is_marked_once_and_registered() -> None:
    assert not EXAMPLES.problems, "\n".join(EXAMPLES.problems)
    names = set(EXAMPLES.by_name())
    registered = set(RUN_HERE) | set(RUN_ELSEWHERE) | {ex for ex, line in NOT_YET_RUN if not line}
    assert not registered - names, f"registered examples no page has: {registered - names}"
    assert not names - registered, f"examples no test runs: {names - registered}"
    overlap = set(RUN_HERE) & ({ex for ex, line in NOT_YET_RUN if not line} | set(RUN_ELSEWHERE))
    assert not overlap, overlap
    tests = {name for name, value in globals().items() if name.startswith("test_")}
    assert set(RUN_HERE.values()) <= tests, set(RUN_HERE.values()) - tests
    for name, path in RUN_ELSEWHERE.items():
        assert (ROOT / path).is_file(), (name, path)
    for ex, line in [*STATIC, *[key for key in NOT_YET_RUN if key[1]]]:
        parts = [part.strip() for cmd in example(ex).commands() for part in cmd.split(" && ")]
        assert line in parts, f"{ex}: no line {line!r} left in the example"


def test_the_marker_check_catches_what_it_should(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "<!-- example: a -->\n```bash\ngpulayer ls\n```\n\n```python\nprint(1)\n```\n"
        "<!-- example: b -->\n```yaml\nx: 1\n```\n"
    )
    (tmp_path / "docs" / "p.md").write_text(
        "- item\n\n    <!-- example: a -->\n    ```bash\n    gpulayer ls  # list\n    ```\n"
        "<!-- example: Bad_Name -->\n```sh\nls\n```\n"
    )
    found = doc_examples.scan(tmp_path)
    assert [(e.name, e.page, e.line) for e in found.examples] == [
        ("a", "README.md", 2),
        ("a", "docs/p.md", 4),
    ]
    assert found.examples[1].commands() == ["gpulayer ls"]
    assert [problem.split(": ", 1)[0] for problem in found.problems] == [
        "README.md:6",
        "docs/p.md:8",
        "docs/p.md:4",
    ]
    assert "taken by README.md:2" in found.problems[2]


def test_commands_join_continuations_and_drop_comments_outside_quotes() -> None:
    body = (
        '# a comment line\ngpulayer schedule create tick --cron "*/10 * * * * *" \\\n'
        '    --gpus 1 -- python poll.py   # trailing\necho "a # b" x#y\n'
    )
    assert doc_examples.commands(body) == [
        'gpulayer schedule create tick --cron "*/10 * * * * *" --gpus 1 -- python poll.py',
        'echo "a # b" x#y',
    ]


def test_install_and_ci_commands_name_what_the_repository_has() -> None:
    """The commands not run here still name files and settings this repository has."""
    for ex in ("readme-install", "index-install"):
        assert example(ex).commands()[0].startswith("pip install -e . && gpulayer submit")
    pyproject = (ROOT / "pyproject.toml").read_text()  # (tomllib is 3.11+; 3.10 is supported)
    assert re.search(r'^name = "gpulayer"$', pyproject, re.M)
    assert re.search(r"^gpulayer = ", pyproject, re.M)  # the console script the examples call

    (ci,) = example("readme-ci").commands()
    assert ci == "bash .ci/run"
    run = (ROOT / ".ci" / "run").read_text()
    assert run.startswith("#!/usr/bin/env bash") and "bash .ci/install" in run
    assert "mkdocs build --strict" in run and "python3 -m pytest" in run

    compile_lock, pins, compile_torch = example("readme-lock-update").commands()
    for command in (compile_lock, compile_torch):
        args = shlex.split(command)
        assert args[:3] == ["uv", "pip", "compile"]
        source, output = args[3], args[args.index("-o") + 1]
        assert (ROOT / source).is_file() and (ROOT / output).is_file()
        assert f"-r {output}" in (ROOT / ".ci" / "install").read_text()  # what CI installs from
    python = shlex.split(compile_lock)[shlex.split(compile_lock).index("--python-version") + 1]
    assert f'requires-python = ">={python}"' in pyproject
    # The torch lock is held to the main lock's pins, read without its editable lines.
    assert pins.startswith("grep -v '^-e' .ci/dev.lock > ")
    assert shlex.split(pins)[-1] in shlex.split(compile_torch)

    apt, service = example("clouds-try-ssh-setup").commands()[:2]
    assert (apt, service) == tuple(line for ex, line in STATIC if ex == "clouds-try-ssh-setup")
    assert "need+=(openssh-server)" in (ROOT / ".ci" / "install").read_text()


# -- the slow runs ----------------------------------------------------------------------------------

TRAIN_PY = """\
import os
import sys
from pathlib import Path

print("training", *sys.argv[1:])
print("EPOCHS", os.environ.get("EPOCHS", "-"))
print("HF_TOKEN", "set" if os.environ.get("HF_TOKEN") else "unset")
data = Path(os.environ.get("GPULAYER_INPUT_DIR", "."), "data", "train.csv")  # where --input stages
if data.exists():
    print("data", data.read_text().splitlines()[0])
out = os.environ.get("GPULAYER_OUTPUT_DIR")
if out:
    Path(out, "model.txt").write_text("weights")
"""
PROJECT = {
    "train.py": TRAIN_PY,
    "etl.py": "print('etl done')\n",
    "sweep.py": "import os\nprint('sweep', os.environ.get('GPULAYER_ARRAY_INDEX'))\n",
    "infer.py": "print('infer')\n",
    "poll.py": "print('poll')\n",
    "eval.py": "import sys\nprint('eval', *sys.argv[1:])\n",
    "data.csv": "text,label\nhello,1\n",
    "job.yaml": "name: train\nworkload: {kind: command, command: [python, train.py]}\n",
    "job.json": '{"name": "train", "workload": {"kind": "command", '
    '"command": ["python", "train.py"]}}\n',
    "pkg/__init__.py": "",
    "pkg/tasks.py": "def train(lr: float) -> dict:\n    return {'lr': lr}\n",
}
NO_PROVIDER = "no cloud provider is installed or enabled"


@pytest.fixture
def reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Reader]:
    without_aws_credentials(monkeypatch, tmp_path)
    user = Reader(tmp_path / "alice")
    user.write(PROJECT)
    yield user
    user.close()


def _yaml_block(page: str, index: int = 0) -> str:
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / page).read_text(), flags=re.S)
    return str(blocks[index])


@pytest.mark.slow
def test_first_job(reader: Reader) -> None:
    """README and the docs' home page: install, a first job, the first steps."""
    for name in ("readme-install", "index-install"):
        run = run_example(reader, example(name), skip=_static_for(name))
        (first,) = run.done.values()
        assert first.returncode == 0, first.stderr
        assert f"hello from {platform.node()}" in first.stdout
        assert run.not_run == {"pip install -e .": STATIC[(name, "pip install -e .")]}

    for name in ("readme-first-steps", "index-first-steps"):
        before = {job["id"] for job in reader.jobs()}
        hello, gpu, listing, logs = example(name).commands()
        run = run_example(reader, example(name), subs={"JOB": lambda _line: reader.jobs()[0]["id"]})
        assert run[hello].returncode == 0 and "hello" in run[hello].stdout, run[hello].stderr
        # No GPU here and no cloud enabled: the detached GPU job is refused at once, naming why.
        assert run[gpu].returncode == 2, run[gpu]
        assert "unschedulable" in run[gpu].stderr and NO_PROVIDER in run[gpu].stderr
        (new,) = [job for job in reader.jobs() if job["id"] not in before]
        assert new["state"] == "succeeded" and new["id"] in run[listing].stdout
        assert run[logs].returncode == 0 and run[logs].stdout.strip() == "hello", run[logs]


def _static_for(name: str) -> dict[str, str]:
    return {line: why for (ex, line), why in STATIC.items() if ex == name}


@pytest.mark.slow
def test_jobs_page(reader: Reader) -> None:
    ex = example("jobs-submit-and-inspect")
    lines = ex.commands()
    (plain, detached, with_file, waits_remote, with_secret, array, plan) = lines[:7]
    assert "--fallback remote" in waits_remote and "--secret HF_TOKEN" in with_secret
    made: dict[str, str] = {}

    def record(line: str, _run: Run) -> None:
        """The id of the job `line` made: the newest one no earlier line made."""
        made[line] = reader.wait_for(
            f"the job of {line!r}",
            lambda: [job["id"] for job in reader.jobs() if job["id"] not in made.values()][:1],
        )[0]

    def job_for(line: str) -> str:
        verb = shlex.split(line)[1]
        # status and logs read the job file's run; cancel ends the one that waits for a remote
        # worker (queued: it ends at once); artifacts fetches what the secret run wrote.
        source = {
            "status": with_file,
            "logs": with_file,
            "cancel": waits_remote,
            "artifacts": with_secret,
        }[verb]
        return made[source]

    reader.env["HF_TOKEN"] = "hf-example-value"  # the reader's own secret, set in their shell
    run = run_example(
        reader,
        ex,
        subs={"JOB": job_for},
        background={waits_remote},
        after=dict.fromkeys((plain, detached, with_file, waits_remote, with_secret), record),
    )
    failed = {line: done for line, done in run.done.items() if done.returncode and line != plan}
    assert not failed, failed
    assert "training --epochs 3" in run[plain].stdout
    assert run[detached].stdout.strip() == made[detached]
    assert "EPOCHS 10" in run[with_file].stdout
    assert (
        "HF_TOKEN set" in run[with_secret].stdout and "data text,label" in run[with_secret].stdout
    )
    assert "hf-example-value" not in run[with_secret].stdout + run[with_secret].stderr
    assert re.fullmatch(r"a-\w+", run[array].stdout.strip()), run[array].stdout
    # No GPU here: the plan says so for this machine, and that no cloud is there to rent one.
    assert run[plan].returncode == 1, run[plan]
    assert "needs a cuda accelerator, has cpu" in run[plan].stdout
    assert f"fallback cloud: unschedulable: {NO_PROVIDER}" in run[plan].stdout
    # The GPU job with a remote fallback waited for a worker until the page's cancel ended it.
    waited = run.background[waits_remote]
    waited.wait(timeout=60)
    out, err = reader.output(waited)
    assert waited.returncode != 0 and "waiting: no remote worker is registered" in err, (out, err)
    assert reader.jobs()[0]["id"] != made[waits_remote]
    state = {job["id"]: job["state"] for job in reader.jobs()}
    assert state[made[waits_remote]] == "cancelled"
    status = next(line for line in lines if line.startswith("gpulayer status"))
    assert made[with_file] in run[status].stdout and "succeeded" in run[status].stdout
    logs = next(line for line in lines if line.startswith("gpulayer logs"))
    assert "EPOCHS 10" in run[logs].stdout
    downloaded = list((reader.project / "out").rglob("model.txt"))
    assert [path.read_text() for path in downloaded] == ["weights"], downloaded
    labelled = next(line for line in lines if "--label team=nlp" in line)
    assert made[detached] not in run[labelled].stdout  # the filter holds: it has no such label

    # The array's 100 jobs end before the page goes on to delete and stop.
    reader.wait_for(
        "the array's jobs to end",
        lambda: not reader.jobs("--state", "queued", "--state", "running"),
        timeout=180,
    )
    _delete, prune, dry_run = example("jobs-delete-prune").commands()
    run = run_example(
        reader, example("jobs-delete-prune"), subs={"JOB...": f"{made[plain]} {made[detached]}"}
    )
    assert all(done.returncode == 0 for done in run.done.values()), run.done
    left = {job["id"] for job in reader.jobs()}
    assert made[plain] not in left and made[detached] not in left and made[with_file] in left
    assert "0 job(s) deleted" in run[prune].stderr  # nothing here is 30 days old
    assert json.loads(run[dry_run].stdout) == []

    validate, validate_json, _schema = example("jobs-validate").commands()
    run = run_example(reader, example("jobs-validate"))
    assert all(done.returncode == 0 for done in run.done.values()), run.done
    assert yaml.safe_load(run[validate].stdout)["placement"]["target"] == "local"
    assert json.loads(run[validate_json].stdout)["workload"]["command"] == ["python", "train.py"]
    schema_file = json.loads((reader.project / "jobspec.schema.json").read_text())
    assert "workload" in schema_file["properties"]

    status, stop, restart = example("jobs-server").commands()
    run = run_example(reader, example("jobs-server"))
    assert run[status].returncode == 0 and "running" in run[status].stdout, run[status]
    assert run[stop].returncode == 0, run[stop]
    assert run[restart].returncode == 0, run[restart]
    again = reader.sh("gpulayer server status")
    assert again.returncode == 0 and "running" in again.stdout, again


@pytest.mark.slow
def test_targets_offers_and_cloud_commands(reader: Reader) -> None:
    local, cloud, dry_run = example("targets-plan").commands()
    run = run_example(reader, example("targets-plan"))
    assert run[local].returncode == 0, run[local]
    assert "plan: the job would run on local worker local" in run[local].stdout
    assert (
        run[cloud].returncode == 1
        and f"the job would be refused: {NO_PROVIDER}" in run[cloud].stdout
    )
    assert run[dry_run].returncode == 0, run[dry_run]
    assert json.loads(run[dry_run].stdout)["target"] == "local"

    a100, exact, as_json, every, slices, submit = example("offers-listing").commands()
    run = run_example(reader, example("offers-listing"))
    assert all(run[line].returncode == 0 for line in (a100, exact, as_json, every, slices))
    rows = [line.split() for line in run[a100].stdout.splitlines() if line.startswith("aws*")]
    assert rows and all("A100" in row for row in rows), run[a100].stdout
    one = [line for line in run[exact].stdout.splitlines() if line.startswith(("aws*", "gcp*"))]
    assert one and all(re.search(r"1x (H100|A100) 80GB", line) for line in one), one
    offers = json.loads(run[as_json].stdout)
    assert offers and all(offer["gpu_count"] == 0 for offer in offers)  # job.yaml asks for CPU
    assert len(run[every].stdout.splitlines()) > 40  # more than the default 30
    assert "1/4 L4" in run[slices].stdout
    assert run[submit].returncode == 2 and NO_PROVIDER in run[submit].stderr

    offers_a100, submit_cloud, cost, reap = example("clouds-commands").commands()[:4]
    # JOB: no cloud job can exist here, so the cost asked for is a job run on this machine.
    ran_here = reader.sh("gpulayer submit -d -- python infer.py")
    assert ran_here.returncode == 0, ran_here.stderr
    run = run_example(
        reader,
        example("clouds-commands"),
        skip=_not_yet("clouds-commands"),
        subs={"JOB": lambda _line: reader.jobs()[0]["id"]},
    )
    assert run[offers_a100].returncode == 0 and "8x A100" in run[offers_a100].stdout
    assert run[submit_cloud].returncode == 2 and NO_PROVIDER in run[submit_cloud].stderr
    assert run[cost].returncode == 0 and run[cost].stdout.splitlines()[-1] == "total: 0", run[cost]
    assert run[reap].returncode == 0 and run[reap].stdout.strip() == "nothing to reap", run[reap]
    assert set(run.not_run) == {line for (ex, line) in NOT_YET_RUN if ex == "clouds-commands"}


def _schedule_rows(reader: Reader) -> dict[str, dict[str, object]]:
    listed = reader.sh("gpulayer schedule ls --json")
    assert listed.returncode == 0, listed.stderr
    return {row["name"]: row for row in json.loads(listed.stdout)}


@pytest.mark.slow
def test_schedule_commands(tmp_path: Path) -> None:
    for page, name in (
        ("schedules.md", "schedules-commands"),
        ("schedule.md", "schedule-commands"),
    ):
        reader = Reader(tmp_path / name)
        try:
            reader.write({**PROJECT, "nightly.yaml": _yaml_block(page)})
            lines = example(name).commands()
            run = run_example(reader, example(name))
            failed = {line: done for line, done in run.done.items() if done.returncode != 0}
            assert not failed, failed
            apply, _create, listing, show = lines[:4]
            assert "nightly-eval" in run[apply].stdout and "tick" in run[listing].stdout
            assert "next ticks" in run[show].stdout
            trigger = next(line for line in lines if " trigger " in line)
            assert trigger in run.done
            runs = reader.jobs("--schedule", "nightly-eval")
            assert len(runs) == 1, runs  # the one run trigger made
            assert set(_schedule_rows(reader)) == {"tick"}  # nightly-eval was deleted last
            if name == "schedules-commands":
                assert json.loads(run[lines[-1]].stdout)["title"] == "Schedule"
        finally:
            reader.close()


@pytest.mark.slow
def test_schedules_sdk(reader: Reader) -> None:
    done = reader.python(example("schedules-sdk"))
    assert done.returncode == 0, done.stderr
    rows = _schedule_rows(reader)
    assert set(rows) == {"nightly-eval", "refresh-events"}, rows
    assert len(reader.jobs("--schedule", "nightly-eval")) == 1  # the one trigger made


@pytest.mark.slow
def test_sdk_map(reader: Reader) -> None:
    done = reader.python(example("sdk-map"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]]"
    functions = [job for job in reader.jobs() if job["name"] == "embed"]
    assert len(functions) == 3 and all(job["state"] == "succeeded" for job in functions)


@pytest.mark.slow
def test_sdk_tour(sshd_lab: SshdLab, ssh_hosts: HostFactory, reader: Reader) -> None:
    """The SDK page's tour. Its cloud is the lab's: one sshd host as the ssh provider's machine,
    named in the clouds page's own providers.yaml (its address, port, user and key swapped in),
    so the `target="cloud"` launch is accepted and rents it (the launch returns at once).
    Then the clouds page's instance commands, about that machine: its job is still being set
    up there (the host reaches no package index, so its `pip install` waits out its retries)."""
    if sshd_lab.mode != "rootfs":
        pytest.skip("needs a host with a filesystem of its own (root, network namespaces)")
    (ssh_host,) = ssh_hosts(1)
    config = yaml.safe_load(_yaml_block("clouds.md", 1))  # "Try it without a cloud account"
    (host,) = config["ssh"]["hosts"]
    host.update(
        address=ssh_host.address,
        port=ssh_host.port,
        user=ssh_host.user,
        key_path=str(ssh_host.client_key),
    )
    reader.gpulayer_home.mkdir(parents=True)
    (reader.gpulayer_home / "providers.yaml").write_text(yaml.safe_dump(config))

    done = reader.python(example("sdk-tour"))
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    assert printed[0].startswith("succeeded training"), printed
    result = "{'checkpoint': 'ckpt-1', 'accuracy': 0.5}"
    assert printed.count(result) == 2  # called here, then as a function job
    mapped = [{"checkpoint": f"ckpt-{i}", "accuracy": 0.5} for i in (1, 2, 3)]
    assert printed[-1] == str(mapped)
    jobs = reader.jobs()
    by_target: dict[str, int] = {}
    for job in jobs:
        by_target[job["target"]] = by_target.get(job["target"], 0) + 1
    # train.py and 10 eval.py and 4 evaluate calls ran here; one job waits for a remote worker;
    # the setup job was taken by the cloud.
    assert by_target == {"local": 15, "remote": 1, "cloud": 1}, jobs
    (waits,) = [job for job in jobs if job["target"] == "remote"]
    assert waits["state"] == "queued"

    (rented,) = [job for job in jobs if job["target"] == "cloud"]
    instances, as_json, status, workers = example("clouds-instances").commands()
    run = run_example(reader, example("clouds-instances"), subs={"JOB": rented["id"]})
    assert all(done.returncode == 0 for done in run.done.values()), run.done
    rows = [line for line in run[instances].stdout.splitlines() if rented["id"] in line]
    assert [row.split()[:2] for row in rows] == [[host["name"], "ssh"]], run[instances].stdout
    (instance,) = json.loads(run[as_json].stdout)
    assert (instance["provider"], instance["job_id"]) == ("ssh", rented["id"])
    assert instance["ended_at"] is None and instance["phases"][0]["phase"] == "provision"
    assert [step["to"] for step in instance["history"]][:3] == ["requested", "launching", "booting"]
    assert f"instance {host['name']} (ssh, " in run[status].stdout, run[status].stdout
    assert re.search(r"^\s*provision\s", run[status].stdout, re.M), run[status].stdout
    assert re.search(r"^local\s", run[workers].stdout, re.M), run[workers].stdout


def _two_remote_workers(reader: Reader, tmp_path: Path) -> None:
    """Two worker processes of this machine joined to the local control plane with a join
    token, as the team server page shows: the nodes of the multi-node examples."""
    made = reader.sh("gpulayer token create --worker --max-workers 2")
    assert made.returncode == 0, made.stderr
    url = json.loads((reader.gpulayer_home / "server.json").read_text())["url"]
    for node in ("node-a", "node-b"):
        machine = tmp_path / node
        machine.mkdir()
        (machine / "join.token").write_text(made.stdout)
        (machine / "join.token").chmod(0o600)
        reader.spawn(
            f"gpulayer worker start --server {url} --token-file {machine / 'join.token'} "
            f"--name {node} --work-dir {machine / 'work'}",
            env={**reader.env, "HOME": str(machine)},
        )
    reader.wait_for("two remote workers", lambda: len([
        w for w in _workers(reader) if w["state"] == "ready" and w["name"] in ("node-a", "node-b")
    ]) == 2)  # fmt: skip


@pytest.mark.slow
def test_multi_node_trainer(reader: Reader, tmp_path: Path) -> None:
    """The Trainer on two remote workers of the local control plane."""
    _two_remote_workers(reader, tmp_path)
    done = reader.python(example("multi-node-trainer"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = re.fullmatch(
        r"\{'final_loss': (?P<final>[\d.e-]+)\} \{'epoch': 9, 'loss': (?P<last>[\d.e-]+)\} "
        r"job:(?P<job>\S+)/checkpoint",
        done.stdout.strip().splitlines()[-1],
    )
    assert printed, done.stdout
    assert printed["final"] == printed["last"]
    # The resumed run was launched and returned at once; it ends on the same two nodes.
    resumed = reader.wait_for("the resumed run to end", lambda: [
        job for job in reader.jobs() if job["id"] != printed["job"] and job["nodes"] == 2
        and job["state"] not in ("queued", "running")], timeout=180)  # fmt: skip
    assert [job["state"] for job in resumed] == ["succeeded"], resumed


@pytest.mark.slow
def test_dashboard_login_links(reader: Reader) -> None:
    import urllib.request

    opened = reader.project / "opened-url"
    browser = reader.project / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    browser.chmod(0o755)
    reader.env["BROWSER"] = str(browser)  # the reader's browser: it notes the page it is given
    _in_browser, printed = example("dashboard-ui").commands()
    run = run_example(reader, example("dashboard-ui"))
    assert all(done.returncode == 0 for done in run.done.values()), run.done
    links = [opened.read_text().strip(), *re.findall(r"http://\S+", run[printed].stdout)]
    assert len(links) == 2 and links[0] != links[1], links
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for link in links:
        with no_proxy.open(link, timeout=30) as page:  # the one-time link logs in
            assert page.status == 200
    with pytest.raises(urllib.error.HTTPError):
        no_proxy.open(links[1], timeout=30)  # and works once


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the page's worker runs --run-as another user")
def test_team_server_page(reader: Reader, tmp_path: Path) -> None:
    ex = example("team-server-setup")
    server, _export, create, listing, _revoke, worker, submit = ex.commands()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    token_file = tmp_path / "etc-gpulayer" / "join.token"
    token_file.parent.mkdir()
    # The worker's folder, reachable by the user its jobs run as (pytest's tree is closed).
    work_dir = Path(tempfile.mkdtemp(prefix="gpulayer-docs-worker-"))
    work_dir.chmod(0o755)
    # The worker machine's shell: its own HOME, none of the admin's exports.
    worker_home = tmp_path / "worker-home"
    worker_home.mkdir()
    worker_shell = {**reader.env, "HOME": str(worker_home)}

    def listening(_line: str, _run: Run) -> None:
        def answers() -> bool:
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", port)) == 0

        reader.wait_for("the server to listen", answers, timeout=60)

    def keep_join_token(line: str, run: Run) -> None:
        """The reader keeps the printed join token in a 0600 file, as the page says."""
        assert run[line].returncode == 0, run[line]
        token_file.write_text(run[line].stdout.strip() + "\n")
        token_file.chmod(0o600)

    spare: dict[str, str] = {}

    def make_spare(_line: str, _run: Run) -> None:
        """A second join token, the one the reader no longer wants (the page revokes one)."""
        made = reader.sh("gpulayer token create --worker --name spare")
        assert made.returncode == 0, made.stderr
        spare["id"] = next(str(t["id"]) for t in _tokens(reader) if t["name"] == "spare")

    def registered(line: str, run: Run) -> None:
        def ready() -> list[dict[str, object]]:
            started = run.background[line]
            assert started.poll() is None, reader.output(started)
            return [w for w in _workers(reader) if w["state"] == "ready"]

        reader.wait_for("the worker to register", ready, timeout=60)

    with postgres_cluster() as database:
        run = run_example(
            reader,
            ex,
            subs={
                "0.0.0.0": "127.0.0.1",  # tests listen on loopback only
                "8765": str(port),
                "http://server:8765": url,
                "postgresql+psycopg://user@db/gpulayer": database,
                "t-3f9a0c1d2e": lambda _line: spare["id"],
                "sudo": "",  # tests run as root (and CI machines have no sudo)
                "/etc/gpulayer/join.token": str(token_file),
                "gpulayer-jobs": "nobody",  # tests make no system users
                "/var/lib/gpulayer": str(work_dir),
            },
            background={server, worker, submit},
            after={
                server: listening,
                create: keep_join_token,
                listing: make_spare,
                worker: registered,
            },
            machines={worker: worker_shell},
        )
        try:
            assert not [line for line, done in run.done.items() if done.returncode], run.done
            assert f"listening on {url} ({database})" in reader.output(run.background[server])[0]
            assert re.fullmatch(r"gl_\S+", run[create].stdout.strip()), run[create].stdout
            assert f"joined {url}" in reader.output(run.background[worker])[1]
            tokens = {str(t["id"]): t for t in _tokens(reader)}
            assert tokens[spare["id"]]["state"] == "revoked"
            (join,) = [t for t in tokens.values() if t["max_workers"] == 4]
            assert join["registered"] == 1  # the worker joined with the page's join token
            (ready,) = _workers(reader)
            assert ready["labels"] == {"pool": "a100"}, ready
            # The worker has no GPU: the GPU job waits for one, and says why.
            waiting = run.background[submit]
            why = "waiting: worker vm: needs a cuda accelerator, has cpu"
            reader.wait_for(
                "the submit to say why it waits",
                lambda: why in reader.output(waiting)[1] or waiting.poll() is not None,
            )
            assert waiting.poll() is None, reader.output(waiting)
            (job,) = reader.jobs()
            assert (job["state"], job["target"]) == ("queued", "remote")
            cancelled = reader.sh(f"gpulayer cancel {job['id']}")  # (the test's, not the page's)
            assert cancelled.returncode == 0, cancelled.stderr
            assert waiting.wait(timeout=60) != 0
        finally:
            reader.close()
            shutil.rmtree(work_dir, ignore_errors=True)


def _tokens(reader: Reader) -> list[dict[str, object]]:
    listed = reader.sh("gpulayer token ls --json --all")
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout))


def _workers(reader: Reader) -> list[dict[str, object]]:
    listed = reader.sh("gpulayer workers --json")
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout))


@pytest.mark.slow
def test_multi_node_command(reader: Reader, tmp_path: Path) -> None:
    """`--nodes 2` with the page's launcher script, which starts torchrun itself on each node."""
    _two_remote_workers(reader, tmp_path)
    train = (ROOT / "tests" / "fixtures" / "ddp" / "train.py").read_text()
    reader.write({"launch.sh": example("multi-node-command-launch").body, "train.py": train})
    # The fixture's train.py reads its epochs from its first argument.
    launch = reader.project / "launch.sh"
    launch.write_text(launch.read_text().rstrip() + " 5\n")
    run = run_example(reader, example("multi-node-command-submit"))
    (submitted,) = run.done.values()
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    (job,) = [job for job in reader.jobs() if job["nodes"] == 2]
    assert job["state"] == "succeeded"
    assert submitted.stdout.count("RANKINFO") == 2, submitted.stdout[-3000:]


@pytest.mark.slow
def test_team_server_secrets(reader: Reader) -> None:
    """The page's secret commands, against the reader's control plane (the same routes a team
    server has), with HF_TOKEN in the reader's shell."""
    value = "hf_docs_example_value"
    reader.env["HF_TOKEN"] = value
    ex = example("team-server-secrets")
    set_line, ls_line, rm_line = ex.commands()
    listed: dict[str, str] = {}

    def kept(line: str, run: Run) -> None:
        assert run[line].stdout.strip() == "kept secret HF_TOKEN", run[line]
        # A shell without it: the job gets the stored value.
        without = {k: v for k, v in reader.env.items() if k != "HF_TOKEN"}
        job = reader.sh(
            "gpulayer submit --secret HF_TOKEN -- python -c "
            "\"import os; print('length', len(os.environ['HF_TOKEN']))\"",
            env=without,
        )
        assert job.returncode == 0, job.stderr
        listed["job"] = job.stdout

    run = run_example(reader, ex, after={set_line: kept})
    assert not [line for line, done in run.done.items() if done.returncode], run.done
    assert f"length {len(value)}" in listed["job"]
    assert "HF_TOKEN" in run[ls_line].stdout and value not in run[ls_line].stdout
    assert run[rm_line].stdout.strip() == "removed secret HF_TOKEN"

