"""A bootstrap whose worker a launcher on other machines starts (a Slurm cluster's compute nodes,
the bootstrap on its login node over the shared filesystem): the worker reaches the tunnel at
the login node's address, and the install waits only for the join."""

from __future__ import annotations

import pytest

from gpulayer.cloud.bootstrap import (
    BootstrapPlan,
    BootstrapPlanError,
    install_command,
    validate_plan,
    worker_args,
)


def plan(**overrides: object) -> BootstrapPlan:
    fields: dict[str, object] = {
        "install_dir": "/shared/gpulayer/j-1",
        "control_plane_port": 8080,
        "worker_token": "t0k",
        "worker_name": "r-1",
        "labels": {},
        "hand_off": True,
        "tunnel_address": "10.0.0.5",
        **overrides,
    }
    return BootstrapPlan(**fields)  # type: ignore[arg-type]


def test_the_worker_reaches_the_tunnel_at_the_login_nodes_address() -> None:
    validate_plan(plan())
    args = worker_args(plan(), 40123)
    assert args[args.index("--server") + 1] == "http://10.0.0.5:40123"
    command = install_command(plan(), "/shared/gpulayer/wheelhouse/k", 40123, 60)
    assert "--hand-off --launched-elsewhere" in command
    # Without one, the worker runs on the SSH host and reaches the tunnel on its loopback.
    alone = plan(tunnel_address=None)
    assert "http://127.0.0.1:40123" in worker_args(alone, 40123)
    assert "--launched-elsewhere" not in install_command(alone, "/w/k", 40123, 60)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hand_off": False}, "tunnel_address: only with hand_off"),
        ({"tunnel_address": "a b"}, "tunnel_address: 'a b' is not a host"),
        ({"tunnel_address": "http://x"}, "is not a host"),
    ],
)
def test_a_tunnel_address_is_checked(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(BootstrapPlanError, match=message):
        validate_plan(plan(**overrides))
