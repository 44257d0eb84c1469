"""engrain's HTTP server: a FastAPI app over one store (see ``docs/api.md``).

:mod:`.app` builds the app; :mod:`.state` holds what routes share; one route
module per area (``runs``, ``routines``, ``cache``, ``memory``, ``agents``).

May import: every pillar. Route modules import :mod:`.state`, never :mod:`.app`.
"""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
