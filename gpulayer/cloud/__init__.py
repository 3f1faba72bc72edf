"""Renting cloud instances for jobs, and the public API of provider plugins.

A plugin imports only what this module names in ``__all__`` (``from gpulayer.cloud import
Offer``): offer and hardware models, errors, settings loading, caches, catalog facts, GPU
facts and probe parsing, the Provider protocol and its types, the bootstrap plan, image
releases, SSH access and backoff policies. What lies behind those names may move between
modules; these names stay.

Names are loaded on first use, so importing the package (or one small module of it, such as
the GPU facts of :mod:`gpulayer.hardware.gpus`, which workers read) loads nothing else; no cloud
SDK and no paramiko is imported here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpulayer.backoff import CLOUD_RESOURCE_RELEASE as CLOUD_RESOURCE_RELEASE
    from gpulayer.backoff import BackoffPolicy as BackoffPolicy
    from gpulayer.cloud.bootstrap import BootstrapError as BootstrapError
    from gpulayer.cloud.bootstrap import BootstrapPlan as BootstrapPlan
    from gpulayer.cloud.bootstrap import BootstrapPlanError as BootstrapPlanError
    from gpulayer.cloud.bootstrap import BootstrapTimeout as BootstrapTimeout
    from gpulayer.cloud.bootstrap import RemoteWorker as RemoteWorker
    from gpulayer.cloud.bootstrap import bootstrap_worker as bootstrap_worker
    from gpulayer.cloud.bootstrap import install_dir_problem as install_dir_problem
    from gpulayer.cloud.bootstrap import remove_command as remove_command
    from gpulayer.cloud.bootstrap import stop_command as stop_command
    from gpulayer.cloud.bootstrap.commands import LAUNCH_DIR_VARIABLE as LAUNCH_DIR_VARIABLE
    from gpulayer.cloud.bootstrap.commands import launcher_loop as launcher_loop
    from gpulayer.cloud.cache import DiskCache as DiskCache
    from gpulayer.cloud.cache import default_cache_dir as default_cache_dir
    from gpulayer.cloud.cache import default_state_dir as default_state_dir
    from gpulayer.cloud.cache import write_json_atomically as write_json_atomically
    from gpulayer.cloud.catalogs import STALE_AFTER_DAYS as STALE_AFTER_DAYS
    from gpulayer.cloud.catalogs import CatalogInfo as CatalogInfo
    from gpulayer.cloud.catalogs import CatalogProvider as CatalogProvider
    from gpulayer.cloud.catalogs import CatalogRefresher as CatalogRefresher
    from gpulayer.cloud.catalogs import NamesRegions as NamesRegions
    from gpulayer.cloud.catalogs import PriceSource as PriceSource
    from gpulayer.cloud.credentials import CredentialSources as CredentialSources
    from gpulayer.cloud.credentials import ReadsCredentials as ReadsCredentials
    from gpulayer.cloud.credentials import credentials_environment as credentials_environment
    from gpulayer.cloud.errors import AuthError as AuthError
    from gpulayer.cloud.errors import CapacityError as CapacityError
    from gpulayer.cloud.errors import ImageNotFoundError as ImageNotFoundError
    from gpulayer.cloud.errors import ProviderError as ProviderError
    from gpulayer.cloud.errors import ProviderNotInstalled as ProviderNotInstalled
    from gpulayer.cloud.errors import ProviderSettingsError as ProviderSettingsError
    from gpulayer.cloud.errors import ProvisionTimeout as ProvisionTimeout
    from gpulayer.cloud.errors import QuotaError as QuotaError
    from gpulayer.cloud.errors import ScopedProviderError as ScopedProviderError
    from gpulayer.cloud.errors import translated as translated
    from gpulayer.cloud.images import ImageRelease as ImageRelease
    from gpulayer.cloud.images import bootstrap_script as bootstrap_script
    from gpulayer.cloud.images import resolve_release as resolve_release
    from gpulayer.cloud.key_check import JobKeyLogin as JobKeyLogin
    from gpulayer.cloud.offer import Hardware as Hardware
    from gpulayer.cloud.offer import MemoryKind as MemoryKind
    from gpulayer.cloud.offer import Offer as Offer
    from gpulayer.cloud.offer import OfferQuery as OfferQuery
    from gpulayer.cloud.offer import check_arch as check_arch
    from gpulayer.cloud.offer import check_os as check_os
    from gpulayer.cloud.protocol import FinishingProvider as FinishingProvider
    from gpulayer.cloud.protocol import GangProvider as GangProvider
    from gpulayer.cloud.protocol import Instance as Instance
    from gpulayer.cloud.protocol import InstanceState as InstanceState
    from gpulayer.cloud.protocol import JobKeyFile as JobKeyFile
    from gpulayer.cloud.protocol import LaunchRequest as LaunchRequest
    from gpulayer.cloud.protocol import OffersAreMachines as OffersAreMachines
    from gpulayer.cloud.protocol import OutlivesReclaim as OutlivesReclaim
    from gpulayer.cloud.protocol import Provider as Provider
    from gpulayer.cloud.protocol import SshVia as SshVia
    from gpulayer.cloud.protocol import launch_zone as launch_zone
    from gpulayer.cloud.protocol import node_install_dir as node_install_dir
    from gpulayer.cloud.ranking import BlockList as BlockList
    from gpulayer.cloud.ranking import FilterResult as FilterResult
    from gpulayer.cloud.ranking import cheapest_over_cap as cheapest_over_cap
    from gpulayer.cloud.ranking import filter_offers as filter_offers
    from gpulayer.cloud.ranking import rank as rank
    from gpulayer.cloud.registry import available_providers as available_providers
    from gpulayer.cloud.registry import get_provider as get_provider
    from gpulayer.cloud.settings import InstallRootSetting as InstallRootSetting
    from gpulayer.cloud.settings import PythonSetting as PythonSetting
    from gpulayer.cloud.settings import load_settings as load_settings
    from gpulayer.errors import GpulayerError as GpulayerError
    from gpulayer.errors import NotFoundError as NotFoundError
    from gpulayer.errors import UsageError as UsageError
    from gpulayer.hardware.gpus import GpuFacts as GpuFacts
    from gpulayer.hardware.gpus import cuda_capability as cuda_capability
    from gpulayer.hardware.gpus import gpu_facts as gpu_facts
    from gpulayer.hardware.gpus import normalize_gpu_name as normalize_gpu_name
    from gpulayer.hardware.gpus import parse_gpu_name as parse_gpu_name
    from gpulayer.hardware.probe_parsing import NVIDIA_FIELDS as NVIDIA_FIELDS
    from gpulayer.hardware.probe_parsing import NVIDIA_FIELDS_LEGACY as NVIDIA_FIELDS_LEGACY
    from gpulayer.hardware.probe_parsing import normalize_cpu_arch as normalize_cpu_arch
    from gpulayer.hardware.probe_parsing import nvidia_query_argv as nvidia_query_argv
    from gpulayer.hardware.probe_parsing import parse_meminfo as parse_meminfo
    from gpulayer.hardware.probe_parsing import parse_nvidia_query as parse_nvidia_query
    from gpulayer.spec.currency import CurrencyCode as CurrencyCode
    from gpulayer.spec.currency import check_currency as check_currency
    from gpulayer.spec.models import Accelerator as Accelerator
    from gpulayer.ssh.authorized_keys import (
        add_authorized_key_command as add_authorized_key_command,
    )
    from gpulayer.ssh.authorized_keys import authorized_key_line as authorized_key_line
    from gpulayer.ssh.authorized_keys import authorized_key_marker as authorized_key_marker
    from gpulayer.ssh.authorized_keys import (
        remove_authorized_key_command as remove_authorized_key_command,
    )
    from gpulayer.ssh.errors import InvalidHostKey as InvalidHostKey
    from gpulayer.ssh.errors import SshAuthError as SshAuthError
    from gpulayer.ssh.errors import SshError as SshError
    from gpulayer.ssh.hostkeys import HostKey as HostKey
    from gpulayer.ssh.hostkeys import JsonHostKeyStore as JsonHostKeyStore
    from gpulayer.ssh.hostkeys import parse_host_key as parse_host_key
    from gpulayer.ssh.hostkeys import valid_host_key_line as valid_host_key_line
    from gpulayer.ssh.keys import KeyPair as KeyPair
    from gpulayer.ssh.keys import generate_keypair as generate_keypair
    from gpulayer.ssh.session import SshSession as SshSession
    from gpulayer.ssh.target import SshTarget as SshTarget
    from gpulayer.ssh.wait import wait_for_ssh as wait_for_ssh

# Each name and the module it is loaded from on first use. The block above says the same to
# type checkers; a unit test holds the two equal.
_EXPORTS = {
    # Offers, and the hardware they (and hosts described by hand) have.
    "Hardware": "gpulayer.cloud.offer",
    "MemoryKind": "gpulayer.cloud.offer",
    "Offer": "gpulayer.cloud.offer",
    "OfferQuery": "gpulayer.cloud.offer",
    "check_arch": "gpulayer.cloud.offer",
    "check_os": "gpulayer.cloud.offer",
    "Accelerator": "gpulayer.spec.models",
    "CurrencyCode": "gpulayer.spec.currency",
    "check_currency": "gpulayer.spec.currency",
    # Ranking and the plugin registry.
    "BlockList": "gpulayer.cloud.ranking",
    "FilterResult": "gpulayer.cloud.ranking",
    "cheapest_over_cap": "gpulayer.cloud.ranking",
    "filter_offers": "gpulayer.cloud.ranking",
    "rank": "gpulayer.cloud.ranking",
    "available_providers": "gpulayer.cloud.registry",
    "get_provider": "gpulayer.cloud.registry",
    # The provider protocol.
    "FinishingProvider": "gpulayer.cloud.protocol",
    "GangProvider": "gpulayer.cloud.protocol",
    "Instance": "gpulayer.cloud.protocol",
    "InstanceState": "gpulayer.cloud.protocol",
    "LaunchRequest": "gpulayer.cloud.protocol",
    "Provider": "gpulayer.cloud.protocol",
    "JobKeyFile": "gpulayer.cloud.protocol",
    "JobKeyLogin": "gpulayer.cloud.key_check",
    "SshVia": "gpulayer.cloud.protocol",
    "OffersAreMachines": "gpulayer.cloud.protocol",
    "OutlivesReclaim": "gpulayer.cloud.protocol",
    "launch_zone": "gpulayer.cloud.protocol",
    "node_install_dir": "gpulayer.cloud.protocol",
    # A launcher of the machine's own that starts the worker a bootstrap hands off.
    "LAUNCH_DIR_VARIABLE": "gpulayer.cloud.bootstrap.commands",
    "launcher_loop": "gpulayer.cloud.bootstrap.commands",
    # Errors: the typed cloud failures, and the base errors the CLI turns into exit codes.
    "AuthError": "gpulayer.cloud.errors",
    "CapacityError": "gpulayer.cloud.errors",
    "ImageNotFoundError": "gpulayer.cloud.errors",
    "ProviderError": "gpulayer.cloud.errors",
    "ProviderNotInstalled": "gpulayer.cloud.errors",
    "ProviderSettingsError": "gpulayer.cloud.errors",
    "ProvisionTimeout": "gpulayer.cloud.errors",
    "QuotaError": "gpulayer.cloud.errors",
    "ScopedProviderError": "gpulayer.cloud.errors",
    "translated": "gpulayer.cloud.errors",
    "GpulayerError": "gpulayer.errors",
    "NotFoundError": "gpulayer.errors",
    "UsageError": "gpulayer.errors",
    # Where credentials are read from: the environment of the submit, else this process's.
    "credentials_environment": "gpulayer.cloud.credentials",
    "CredentialSources": "gpulayer.cloud.credentials",
    "ReadsCredentials": "gpulayer.cloud.credentials",
    # Settings, caches, catalogs.
    "InstallRootSetting": "gpulayer.cloud.settings",
    "PythonSetting": "gpulayer.cloud.settings",
    "load_settings": "gpulayer.cloud.settings",
    "DiskCache": "gpulayer.cloud.cache",
    "default_cache_dir": "gpulayer.cloud.cache",
    "default_state_dir": "gpulayer.cloud.cache",
    "write_json_atomically": "gpulayer.cloud.cache",
    "STALE_AFTER_DAYS": "gpulayer.cloud.catalogs",
    "CatalogInfo": "gpulayer.cloud.catalogs",
    "CatalogProvider": "gpulayer.cloud.catalogs",
    "CatalogRefresher": "gpulayer.cloud.catalogs",
    "NamesRegions": "gpulayer.cloud.catalogs",
    "PriceSource": "gpulayer.cloud.catalogs",
    # GPU facts, and reading what a machine's tools print.
    "GpuFacts": "gpulayer.hardware.gpus",
    "cuda_capability": "gpulayer.hardware.gpus",
    "gpu_facts": "gpulayer.hardware.gpus",
    "normalize_gpu_name": "gpulayer.hardware.gpus",
    "parse_gpu_name": "gpulayer.hardware.gpus",
    "NVIDIA_FIELDS": "gpulayer.hardware.probe_parsing",
    "NVIDIA_FIELDS_LEGACY": "gpulayer.hardware.probe_parsing",
    "normalize_cpu_arch": "gpulayer.hardware.probe_parsing",
    "nvidia_query_argv": "gpulayer.hardware.probe_parsing",
    "parse_meminfo": "gpulayer.hardware.probe_parsing",
    "parse_nvidia_query": "gpulayer.hardware.probe_parsing",
    # Turning a machine into a worker, and the images that do it at boot.
    "BootstrapError": "gpulayer.cloud.bootstrap",
    "BootstrapPlan": "gpulayer.cloud.bootstrap",
    "BootstrapPlanError": "gpulayer.cloud.bootstrap",
    "BootstrapTimeout": "gpulayer.cloud.bootstrap",
    "RemoteWorker": "gpulayer.cloud.bootstrap",
    "bootstrap_worker": "gpulayer.cloud.bootstrap",
    "install_dir_problem": "gpulayer.cloud.bootstrap",
    "remove_command": "gpulayer.cloud.bootstrap",
    "stop_command": "gpulayer.cloud.bootstrap",
    "ImageRelease": "gpulayer.cloud.images",
    "bootstrap_script": "gpulayer.cloud.images",
    "resolve_release": "gpulayer.cloud.images",
    # SSH access, for providers that reach their machines over SSH.
    "HostKey": "gpulayer.ssh.hostkeys",
    "InvalidHostKey": "gpulayer.ssh.errors",
    "JsonHostKeyStore": "gpulayer.ssh.hostkeys",
    "KeyPair": "gpulayer.ssh.keys",
    "SshAuthError": "gpulayer.ssh.errors",
    "SshError": "gpulayer.ssh.errors",
    "SshSession": "gpulayer.ssh.session",
    "SshTarget": "gpulayer.ssh.target",
    "add_authorized_key_command": "gpulayer.ssh.authorized_keys",
    "authorized_key_line": "gpulayer.ssh.authorized_keys",
    "authorized_key_marker": "gpulayer.ssh.authorized_keys",
    "remove_authorized_key_command": "gpulayer.ssh.authorized_keys",
    "generate_keypair": "gpulayer.ssh.keys",
    "valid_host_key_line": "gpulayer.ssh.hostkeys",
    "parse_host_key": "gpulayer.ssh.hostkeys",
    "wait_for_ssh": "gpulayer.ssh.wait",
    # How a provider waits and tries again.
    "BackoffPolicy": "gpulayer.backoff",
    "CLOUD_RESOURCE_RELEASE": "gpulayer.backoff",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
