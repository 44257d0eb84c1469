"""engrain's HTTP server: a FastAPI app over one store (see ``docs/api.md``)."""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
