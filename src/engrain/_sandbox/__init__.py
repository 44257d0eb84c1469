"""Sandboxed tools: WASI modules on wasmtime, and CPython-on-WASI for untrusted UDFs.

:mod:`.wasi` holds the runtime (limits, module cache, ``WasmTool``,
``run_wasm``); :mod:`.udf_host` runs Python UDFs (``SandboxUdfHost``) on the
pinned CPython-on-WASI, with its compiled module and standard library cached on
disk. ``engrain.sandbox`` is this package.

May import: ``_errors`` and ``_disk_cache`` only. Every other pillar may import it.
"""

from .udf_host import SandboxUdfHost
from .wasi import Limits, WasmTool, load_module, run_wasm

__all__ = ["Limits", "SandboxUdfHost", "WasmTool", "load_module", "run_wasm"]
