"""Turn a machine reachable over SSH into a worker of this control plane: see
:func:`gpulayer.cloud.bootstrap.run.bootstrap_worker`. The modules: ``plan`` (what to do,
checked), ``commands`` (the host commands, pure), ``worker_install`` (the worker's install,
once per machine and version, and ``host_worker``, its host side), ``output`` (what the
bootstrap says, never quiet for long), ``remote`` (a started worker), ``run`` (the steps),
``errors``."""

from gpulayer.cloud.bootstrap.commands import (
    LAUNCH_DIR_VARIABLE,
    LOG_NAME,
    MIN_PYTHON,
    PHASE_PREFIX,
    PID_NAME,
    SCRIPT_NAME,
    STOP_GRACE_SECONDS,
    TOKEN_NAME,
    HostPython,
    install_command,
    launcher_loop,
    missing_wheels,
    parse_probe,
    probe_command,
    remove_command,
    stop_command,
)
from gpulayer.cloud.bootstrap.errors import (
    BootstrapError,
    BootstrapPlanError,
    BootstrapTimeout,
    HostIncompatible,
    RemoteWorkerError,
)
from gpulayer.cloud.bootstrap.plan import (
    BootstrapPlan,
    check_install_dir,
    default_wheelhouse_dir,
    install_dir_problem,
    validate_plan,
    worker_args,
)
from gpulayer.cloud.bootstrap.remote import RemoteWorker
from gpulayer.cloud.bootstrap.run import bootstrap_worker

__all__ = [
    "LAUNCH_DIR_VARIABLE",
    "LOG_NAME",
    "MIN_PYTHON",
    "PHASE_PREFIX",
    "PID_NAME",
    "SCRIPT_NAME",
    "STOP_GRACE_SECONDS",
    "TOKEN_NAME",
    "BootstrapError",
    "BootstrapPlan",
    "BootstrapPlanError",
    "BootstrapTimeout",
    "HostIncompatible",
    "HostPython",
    "RemoteWorker",
    "RemoteWorkerError",
    "bootstrap_worker",
    "check_install_dir",
    "default_wheelhouse_dir",
    "install_command",
    "install_dir_problem",
    "launcher_loop",
    "missing_wheels",
    "parse_probe",
    "probe_command",
    "remove_command",
    "stop_command",
    "validate_plan",
    "worker_args",
]
