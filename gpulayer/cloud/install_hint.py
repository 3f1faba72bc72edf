"""How to install a provider plugin, named so the command works, and the closest real name
for a typo (`shh` is `ssh`, not a package called gpulayer-shh)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

# The plugins gpulayer's source ships under providers/<name> (distribution gpulayer-<name>).
SHIPPED_PLUGINS: tuple[str, ...] = ("aws", "gcp", "slurm", "ssh")


# providers/ beside the gpulayer package: there in a source checkout.
_SOURCE_PROVIDERS = Path(__file__).resolve().parents[2] / "providers"


def _checkout_dir(name: str) -> Path | None:
    """providers/<name> beside the gpulayer package, when running from a source checkout."""
    candidate = _SOURCE_PROVIDERS / name
    return candidate if (candidate / "pyproject.toml").is_file() else None


def known_plugins() -> list[str]:
    root = _SOURCE_PROVIDERS
    found = {p.parent.name for p in root.glob("*/pyproject.toml")} if root.is_dir() else set()
    return sorted(found | set(SHIPPED_PLUGINS))


def install_hint(name: str) -> str:
    """``pip install -e /src/gpulayer/providers/ssh`` from a checkout, else the distribution."""
    directory = _checkout_dir(name)
    if directory is not None:
        return f"pip install -e {directory}"
    return f"install the gpulayer-{name} distribution (providers/{name} in gpulayer's source)"


def closest_name(given: str, names: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(given, sorted(set(names)), n=1, cutoff=0.5)
    return found[0] if found else None


def not_installed_line(name: str, installed: Iterable[str], also: Iterable[str] = ()) -> str:
    """Why provider ``name`` cannot be used and what to do about it, in one line; ``also``
    adds names a typo may have meant (the ``gpulayer`` section of providers.yaml)."""
    installed = sorted(installed)
    listing = ", ".join(installed) or "none"
    if name in known_plugins():
        return f"provider {name!r} is not installed (installed: {listing}); {install_hint(name)}"
    guess = closest_name(name, [*installed, *known_plugins(), *also])
    hint = f"; did you mean {guess!r}?" if guess else ""
    return f"no provider is called {name!r} (installed: {listing}){hint}"
