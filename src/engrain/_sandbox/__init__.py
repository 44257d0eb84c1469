"""Sandboxed tools: WASI modules on wasmtime, and CPython-on-WASI for untrusted UDFs.

:mod:`.wasi` holds the runtime (limits, module cache, ``run_wasm``,
``SandboxUdfHost``). ``engrain.sandbox`` is this package.

May import: ``_errors`` only. Every other pillar may import it.
"""

from .wasi import Limits, SandboxUdfHost, WasmTool, load_module, run_wasm

__all__ = ["Limits", "SandboxUdfHost", "WasmTool", "load_module", "run_wasm"]
