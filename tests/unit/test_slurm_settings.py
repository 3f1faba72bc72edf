"""The slurm section of providers.yaml: refused with one line naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from gpulayer_slurm import SlurmProvider

from gpulayer.cloud import ProviderSettingsError


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({}, "clusters: Field required"),
        ({"clusters": {}}, "clusters: Dictionary should have at least 1 item"),
        (
            {"clusters": {"lab": {"login": "h"}}},
            "clusters.lab: user: required when login is a host",
        ),
        (
            {"clusters": {"lab": {"login": "h", "user": "u"}}},
            "clusters.lab: key_file: required when login is a host",
        ),
        (
            {"clusters": {"lab": {"login": "local", "hourly_price": {"gpu": -1}}}},
            "clusters.lab.hourly_price.gpu: Input should be greater than or equal to 0",
        ),
        (
            {
                "clusters": {
                    "lab": {"login": "local", "partitions": ["gpu"], "hourly_price": {"cpu": 1}}
                }
            },
            "clusters.lab: hourly_price.cpu: not one of the partitions (gpu)",
        ),
        (
            {"clusters": {"lab": {"login": "local", "gpu_types": {"p": "zz9"}}}},
            "clusters.lab.gpu_types: p: 'zz9' is not a GPU model gpulayer knows",
        ),
        ({"clusters": {"bad name": {"login": "local"}}}, "clusters: 'bad name': 1-63 letters"),
        (
            {"clusters": {"lab": {"login": "local", "qos": "a b"}}},
            "clusters.lab.qos: 'a b' is not a Slurm name",
        ),
        (
            {"clusters": {"lab": {"login": "local", "logn": "x"}}},
            "clusters.lab.logn: unknown setting; did you mean 'login'?",
        ),
        (
            {"clusters": {"lab": {"login": "a@b", "user": "u", "key_file": "k"}}},
            "clusters.lab.login:",
        ),
        (
            {"clusters": {"lab": {"login": "local", "host_key": "not a key"}}},
            "clusters.lab.host_key: host key 'not a key' is not an OpenSSH public key line",
        ),
        (
            {"clusters": {"lab": {"login": "local", "shared_dir": "rel/dir"}}},
            "clusters.lab.shared_dir: job directories below 'rel/dir': must be an absolute path",
        ),
        (
            {"clusters": {"lab": {"login": "local", "nodes_via_login": "yes"}}},
            "clusters.lab.nodes_via_login: 'yes' (a string) is not a boolean",
        ),
        (
            {"clusters": {"lab": {"login": "local", "shared_install_root": "/shared/gl"}}},
            "clusters.lab: shared_install_root: needs a login node reached over SSH",
        ),
        (
            {
                "clusters": {
                    "lab": {
                        "login": "h",
                        "user": "u",
                        "key_file": "k",
                        "shared_install_root": "shared/gl",
                    }
                }
            },
            "clusters.lab.shared_install_root: must be an absolute path or one starting with ~/",
        ),
        (
            {
                "clusters": {
                    "lab": {
                        "login": "h",
                        "user": "u",
                        "key_file": "k",
                        "shared_install_root": "/etc",
                    }
                }
            },
            "clusters.lab.shared_install_root: job directories below '/etc': is a system",
        ),
    ],
)
def test_bad_settings_are_refused_naming_the_field(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ProviderSettingsError) as caught:
        SlurmProvider(section)
    text = str(caught.value)
    assert message in text and "\n" not in text


def test_a_cluster_over_ssh_with_prices() -> None:
    provider = SlurmProvider(
        {"clusters": {"lab": {"login": "login.example", "user": "ada", "key_file": "~/.ssh/id",
                              "partitions": ["gpu"], "account": "ml", "qos": "normal",
                              "hourly_price": {"gpu": 1.5}}}}
    )  # fmt: skip
    cluster = provider.settings.clusters["lab"]
    assert cluster.price("gpu") == 1.5 and cluster.price("other") == 0
    assert not str(cluster.key_file).startswith("~") and not cluster.local


def test_a_shared_wheelhouse_is_named_by_the_shared_dir_and_its_key() -> None:
    from gpulayer.cloud.protocol import Instance, shared_wheelhouse_dir

    assert shared_wheelhouse_dir(None, "gpulayer-1.0-py3.11") is None
    assert shared_wheelhouse_dir("/shared/gpulayer/", "k1") == "/shared/gpulayer/wheelhouse/k1"
    # An instance stored before the field existed said it in a tag.
    stored = {"id": "n", "provider": "slurm", "region": "lab", "state": "running"}
    old = Instance.model_validate(
        {**stored, "ssh_user": "u", "tags": {"gpulayer:wheelhouse-root": "/shared/gpulayer/"}}
    )
    assert old.shared_dir == "/shared/gpulayer/"


def test_a_shared_install_root_may_be_in_the_login_users_home() -> None:
    provider = SlurmProvider(
        {"clusters": {"lab": {"login": "login.example", "user": "ada", "key_file": "~/.ssh/id",
                              "shared_install_root": "~/.gpulayer/slurm/"}}}
    )  # fmt: skip
    assert provider.settings.clusters["lab"].shared_install_root == "~/.gpulayer/slurm"
