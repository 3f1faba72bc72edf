"""What submits hand over, held in memory: a cloud job's secret values, by the variable each
secret is read from, kept only for the keys the job names and dropped with the job."""

from __future__ import annotations

from gpulayer.control.submit_environments import SubmitEnvironments
from gpulayer.spec.validate import validate_spec

SPEC = validate_spec(
    {
        "workload": {"kind": "command", "command": ["true"]},
        "secrets": [{"name": "HF_TOKEN"}, {"name": "DB", "key": "DB_PASSWORD"}, {"name": "GONE"}],
    }
)


def test_only_the_jobs_secret_keys_are_kept_and_dropped_with_the_job() -> None:
    held = SubmitEnvironments()
    shell = {"HF_TOKEN": "hf-1", "DB_PASSWORD": "pw", "DB": "not-the-key", "OTHER": "x"}
    held.keep_secrets("j1", SPEC, shell)
    assert held.secrets_for("j1") == {"HF_TOKEN": "hf-1", "DB_PASSWORD": "pw"}
    assert held.secrets_for("j2") == {}
    held.keep_secrets("j3", SPEC, {"OTHER": "x"})
    assert held.secrets_for("j3") == {}
    held.forget_cloud_environments(keep=set(), is_terminal=lambda job_id: job_id == "j1")
    assert held.secrets_for("j1") == {}
