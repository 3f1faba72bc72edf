"""What `offers` and `plan` hand the local control plane so that they ask the clouds as a
`submit` from this shell would: the cloud credential variables of this environment (keys
exported after the control plane started). Held in memory for the one call, never stored."""

from __future__ import annotations

import os
from typing import Any


def cloud_credentials(connection: Any) -> dict[str, str] | None:
    """This shell's cloud credential variables, for the local control plane only: a team
    server reads its own credentials, never a client's."""
    if not connection.embedded:
        return None
    from gpulayer.cloud.credentials import credential_variables

    return credential_variables(os.environ)
