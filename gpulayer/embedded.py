"""The embedded local control plane assembled: the control plane's daemon with this machine's
own worker in the same process, over an in-process link.

It sits above both control and worker (the one module allowed to join them) so that neither
imports the other. `python -m gpulayer.embedded` is what a command that needs a local control
plane starts (see gpulayer.control.local_daemon).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpulayer.control.paths import HomeLayout
    from gpulayer.control.service import ControlService
    from gpulayer.worker.agent import WorkerAgent


def local_worker(service: ControlService, layout: HomeLayout) -> WorkerAgent:
    from gpulayer.control.local_link import LocalLink
    from gpulayer.worker import start_local_worker

    return start_local_worker(LocalLink(service), data_dir=layout.root, work_root=layout.jobs_dir)


def main() -> None:
    from gpulayer.control.daemon import DEFAULT_IDLE_SECONDS, serve
    from gpulayer.control.paths import home

    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    idle = float(os.environ.get("GPULAYER_IDLE_SECONDS", DEFAULT_IDLE_SECONDS))
    sys.exit(serve(home(), idle_seconds=idle, start_worker=local_worker))


if __name__ == "__main__":
    main()
