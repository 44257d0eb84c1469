"""``engrain.Client``: the HTTP API of ``engrain serve`` with the local API's method names."""

from .client import Client

__all__ = ["Client"]
