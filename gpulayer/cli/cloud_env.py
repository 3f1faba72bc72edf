"""What `offers` and `plan` hand the local control plane so that it asks the clouds as for a
`submit` from this shell: this environment, of which it keeps the cloud credential variables
(keys exported after it started; see gpulayer.cloud.credentials) in memory for the one call.
Sent over the loopback connection only, as a submit's is; never stored, logged or put in argv."""

from __future__ import annotations

import os
from typing import Any


def cloud_credentials(connection: Any) -> dict[str, str] | None:
    """This shell's environment, for the local control plane only: a team server reads its
    own credentials, never a client's."""
    return dict(os.environ) if connection.embedded else None
