"""The control plane's HTTP routes, one router per resource.

Each module holds one resource's routes on a module-level ``router`` and reaches the service
only through the dependencies of ``deps`` (which read the app's ``ApiContext``), so a router can
be mounted on a bare app with ``install_context`` and tested alone; ``api.create_app`` includes
them all.
"""
