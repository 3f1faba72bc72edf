"""The web dashboard the control plane serves at /ui/ (server-rendered, Jinja2)."""

from gpulayer.control.ui.routes import mount_ui

__all__ = ["mount_ui"]
