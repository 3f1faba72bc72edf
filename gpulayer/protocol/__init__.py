"""The worker protocol, shared by the control plane and the worker so that neither imports the
other: its messages (`messages`), the HTTP client that speaks it (`client`) and the source
bundle format both ends read and write (`bundle`).

Kept light to import: the CLI reaches it at start-up, so nothing here loads pathspec or an
HTTP framework until a submodule that needs it is imported.
"""
