"""Model files derived from the shipped MiniLM: made once on first use, cached and checked by digest.

The default embedder (:class:`.embed.MiniLMEmbedder`) computes the shipped
file's int8 weights in integers (:func:`block_model`); the opt-in
``"minilm-int8"`` is onnxruntime's dynamic quantization of it
(:func:`quantized_model`). Both are written atomically under
:func:`model_cache` with a sidecar naming the source, the recipe and the
output's SHA-256 (:func:`_derived`).

Like :mod:`.embed`, this module imports nothing from engrain at its top, so the
benchmark's peer venv can load it by file path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

try:
    from .._errors import EmbeddingError
except ImportError:  # loaded by file path (bench peer): no parent package
    EmbeddingError = RuntimeError  # type: ignore[misc,assignment]

#: Values of ``K`` sharing one activation scale in the default's matmuls: 16 recalled within a question of 32 on
#: every set of bench/memory_quality.py and embedded ~0.3 ms slower; 64 strayed further from fp32 and was not
#: faster (2026-11-27).
BLOCK = 32


def _onnxruntime() -> Any:
    """onnxruntime, or a clear error where importing it would crash the process.

    onnxruntime (1.32) imported after usearch's compiled module (2.26) dies in its
    own import (a segmentation fault, not an exception). engrain imports it before
    usearch itself (:func:`.index._usearch_index`); a program that imported usearch
    first gets this error instead of losing the process.
    """
    if "onnxruntime" not in sys.modules and "usearch.compiled" in sys.modules:
        raise EmbeddingError(
            "the local embedding model cannot load: onnxruntime crashes the process when it is imported after "
            "usearch's compiled module, and usearch is already imported here. Import engrain's memory "
            "(or onnxruntime) before usearch, or use another embedder (Memory(embedder='openai:...')).")
    import onnxruntime

    return onnxruntime


def model_cache() -> Path:
    """Where derived model files are kept (``$ENGRAIN_MODEL_CACHE``, else the user's cache folder)."""
    env = os.environ.get("ENGRAIN_MODEL_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "engrain" / "models"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _derived(source: Path, cache: Path | None, filename: str, recipe: str, make: Callable[[Any, Path, Path], None]
             ) -> Path:
    """``make(onnxruntime, source, out)``'s model file, made once and cached (checked by digest on every load).

    The file and a sidecar naming the source's and the output's SHA-256 and the
    ``recipe`` are written atomically, model first: a crash between the two, a
    file that does not match its sidecar, another source or another recipe make
    it again. A read-only cache folder falls back to the temp folder.
    """
    cache = cache or model_cache()
    st = source.stat()
    out = cache / filename
    side = out.with_suffix(".json")
    try:
        meta = json.loads(side.read_text())
        if meta.get("source_size") == st.st_size and meta.get("source_mtime") == st.st_mtime_ns \
                and meta.get("recipe", "dynamic-v1") == recipe and out.is_file() and _sha256(out) == meta.get("sha256"):
            return out
    except (OSError, ValueError, AttributeError):
        pass
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tempfile.NamedTemporaryFile(dir=cache, prefix=".probe-").close()
    except OSError as e:  # a read-only home: the temp folder instead (same model, same vectors)
        fallback = Path(tempfile.gettempdir()) / f"engrain-models-{os.getuid() if hasattr(os, 'getuid') else 0}"
        if cache == fallback:
            raise EmbeddingError(f"cannot write the derived embedding model {filename} to {cache}: {e}") from e
        return _derived(source, fallback, filename, recipe, make)
    ort = _onnxruntime()
    with tempfile.TemporaryDirectory(dir=cache, prefix=".derive-") as tmp:
        made = Path(tmp) / filename
        make(ort, source, made)
        meta = {"source_sha256": _sha256(source), "source_size": st.st_size, "source_mtime": st.st_mtime_ns,
                "sha256": _sha256(made), "recipe": recipe, "onnxruntime": ort.__version__}
        os.replace(made, out)  # model first, sidecar second: a crash between leaves a mismatch, made again
        side_tmp = Path(tmp) / "side.json"
        side_tmp.write_text(json.dumps(meta))
        os.replace(side_tmp, side)
    return out


def quantized_model(source: Path, cache: Path | None = None) -> Path:
    """The shipped model quantized for integer compute, made once and cached (:func:`_derived`).

    The shipped file stores int8 weights that it dequantizes into fp32 matmuls.
    Its dequantization is folded into fp32 weights (onnxruntime's constant
    folding), then onnxruntime's dynamic quantization turns every weight matmul
    into an int8 ``MatMulInteger`` with per-channel weight scales (per-tensor
    scales moved vectors to a cosine of 0.93 with the fp32-computed ones,
    per-channel keeps 0.99).

    No variant tried kept recall within 0.005 of the shipped file on every set
    (bench/memory_quality.py, 2026-11-26; LoCoMo dev any@5 / chat any@5, shipped
    .675 / .406): this one .655 / .396; only the feed-forward matmuls quantized
    (attention fp32) .658 / .394; 7-bit weights (``reduce_range``) .672 / .398
    but a cosine with the shipped vectors of 0.990 against this one's 0.992, so
    its LoCoMo figure is luck, and chat -0.008, LoCoMo session-hit@1 -0.009;
    uint8 weights .661. Hence an opt-in: a whole activation tensor shares one
    scale here, where the default (:func:`block_model`) gives each 32 values theirs.
    """
    return _derived(source, cache, "minilm-dyn-int8.onnx", "dynamic-v1", _quantize_dynamic)


def _quantize_dynamic(ort: Any, source: Path, out: Path) -> None:
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as e:
        raise EmbeddingError("quantizing the embedding model needs onnx: pip install onnx") from e
    folded = out.with_name("folded.onnx")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # folds the dequantization
    opts.optimized_model_filepath = str(folded)
    opts.log_severity_level = 3
    ort.InferenceSession(str(source), sess_options=opts, providers=["CPUExecutionProvider"])
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs advice ("run pre-processing") to the root logger
    try:
        quantize_dynamic(str(folded), str(out), weight_type=QuantType.QInt8, per_channel=True)
    finally:
        root.setLevel(level)


def block_model(source: Path, cache: Path | None = None) -> Path:
    """The shipped model with its weight matmuls in integer compute, made once and cached (:func:`_derived`).

    The shipped file keeps each weight matrix as int8 codes with one fp32 scale per
    output column, dequantized into an fp32 matmul at load: ~42 MB of fp32
    weights that every query reads. Each such matmul becomes onnxruntime's
    ``MatMulNBits`` with the *same* codes and scales (8 bits, so the weights are
    exactly the shipped ones) and ``accuracy_level`` 4: the activations are
    quantized to int8 per row in blocks of :data:`BLOCK` values and multiplied
    with VNNI integer dot products. Only that activation rounding differs from
    the fp32 computation: vectors at cosine >= 0.9996 with the shipped ones,
    the same for a text alone or in any batch. A query embeds in ~3.2 ms against
    ~4 ms, and ~4.3 against ~6.5 ms after the rest of a recall has pushed the
    weights out of the CPU's cache, as a recall at 1M records does.

    Made, it is checked: its vectors for fixed token ids must match the shipped
    computation's (cosine >= 0.999), or it is refused (an onnxruntime without
    these kernels, or a changed model file).
    """
    return _derived(source, cache, f"minilm-block{BLOCK}.onnx", f"block{BLOCK}-v1", _block_quantize)


def _block_quantize(ort: Any, source: Path, out: Path) -> None:
    try:
        import onnx
        from onnx import helper, numpy_helper
    except ImportError as e:
        raise EmbeddingError("preparing the embedding model needs onnx: pip install onnx") from e
    model = onnx.load(str(source))
    graph = model.graph
    consts = {i.name: i for i in graph.initializer}
    made_by = {o: n for n in graph.node for o in n.output}
    nodes, extra = [], []
    for node in graph.node:
        weights = _int8_weights(node, made_by, consts, numpy_helper)
        if weights is None:
            nodes.append(node)
            continue
        codes, scale = weights  # (K, N) int8, (N,) float32
        k, n = codes.shape
        blocks = -(-k // BLOCK)
        packed = np.full((n, blocks * BLOCK), 128, dtype=np.uint8)  # 128: the zero of MatMulNBits' 8-bit codes
        packed[:, :k] = (codes.astype(np.int16) + 128).astype(np.uint8).T
        b_name, s_name = f"{node.name or node.output[0]}.codes", f"{node.name or node.output[0]}.scales"
        extra += [numpy_helper.from_array(packed.reshape(n, blocks, BLOCK), b_name),
                  numpy_helper.from_array(np.repeat(scale[:, None], blocks, axis=1).reshape(-1), s_name)]
        nodes.append(helper.make_node("MatMulNBits", [node.input[0], b_name, s_name], list(node.output),
                                      name=f"{node.name or node.output[0]}.block", domain="com.microsoft",
                                      K=k, N=n, bits=8, block_size=BLOCK, accuracy_level=4))
    if not extra:
        raise EmbeddingError(f"the embedding model {source} has no int8 weight matmuls to compute in integers "
                             "(is it the shipped file?); use Memory(embedder='minilm-fp32') to run it as it is")
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(extra)
    while True:  # the dequantizing Cast/Mul pairs now feed nothing: drop them, then their constants
        used = {i for nd in graph.node for i in nd.input} | {o.name for o in graph.output}
        live = [nd for nd in graph.node if any(o in used for o in nd.output)]
        if len(live) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(live)
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(out))
    _check_close(ort, source, out)


def _int8_weights(node: Any, made_by: dict[str, Any], consts: dict[str, Any], numpy_helper: Any
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    """A MatMul's weights when they are ``Cast(int8 constant (K, N)) * per-column scale``, as the shipped file's are."""
    if node.op_type != "MatMul" or len(node.input) != 2:
        return None
    mul = made_by.get(node.input[1])
    if mul is None or mul.op_type != "Mul":
        return None
    cast = made_by.get(mul.input[0])
    if cast is None or cast.op_type != "Cast" or cast.input[0] not in consts or mul.input[1] not in consts:
        return None
    codes = numpy_helper.to_array(consts[cast.input[0]])
    scale = numpy_helper.to_array(consts[mul.input[1]]).astype(np.float32)
    if codes.dtype != np.int8 or codes.ndim != 2 or scale.size not in (1, codes.shape[1]) \
            or (scale.ndim == 2 and scale.shape[0] != 1):
        return None
    return codes, np.broadcast_to(scale.reshape(-1), (codes.shape[1],)).copy()


def _normalize(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.clip(norms, 1e-12, None)).astype(np.float32)


def session_for(ort: Any, path: Path, threads: int | None) -> Any:
    """An onnxruntime CPU session of the model file at ``path`` (``threads``: intra-op threads, None: its default)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    # Without this the worker threads busy-wait after each run and starve
    # the numpy / SQLite work a recall does right after embedding.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def _check_close(ort: Any, source: Path, made: Path, floor: float = 0.999) -> None:
    """Refuse ``made`` unless its pooled vectors for fixed token ids are within ``floor`` of ``source``'s."""
    rng = np.random.default_rng(5)
    ids = rng.integers(1000, 29000, size=(4, 24), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    outs = []
    for path in (source, made):
        session = session_for(ort, path, 1)
        names = {i.name for i in session.get_inputs()}
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if "token_type_ids" in names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        outs.append(_normalize(session.run(None, feeds)[0].mean(axis=1)))
    cos = float((outs[0] * outs[1]).sum(axis=1).min())
    if not cos >= floor:
        raise EmbeddingError(f"the integer-compute embedding model made from {source} gives vectors at cosine "
                             f"{cos:.4f} with the shipped computation (at least {floor} expected): this onnxruntime "
                             f"({ort.__version__}) computes MatMulNBits differently; use "
                             "Memory(embedder='minilm-fp32')")
