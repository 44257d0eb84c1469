"""Embedders named by a model string, as ``eg.Agent`` names its model.

``Memory(embedder=...)``, the server (``engrain serve --embedder``) and
``$ENGRAIN_EMBEDDER`` take one of:

* ``"default"`` (or ``"minilm"``, or its full name ``"all-MiniLM-L6-v2-onnx-int8-block32"``):
  the shipped all-MiniLM-L6-v2, its int8 weights in integer compute (:mod:`.embed`);
* ``"minilm-fp32"`` (full name ``"all-MiniLM-L6-v2-onnx-int8"``): the same file
  computed as it ships, in fp32 matmuls: the default until 2026-11-27, so a
  store it filled opens with it (``reembed`` moves the store to the default);
* ``"minilm-int8"`` (full name ``"all-MiniLM-L6-v2-onnx-dyn-int8"``): the same
  model dynamically quantized on first use, about 2x faster per query than
  ``"minilm-fp32"`` and 0.004-0.020 lower any@5 on each set of
  ``bench/memory_quality.py`` (opt-in);
* ``"openai:<model>"``: OpenAI's embeddings API, or any compatible server with
  ``base_url`` (vLLM, LM Studio, LiteLLM, ...), through the official SDK;
* ``"ollama:<model>"``: a local Ollama through its OpenAI-compatible endpoint
  (``$OLLAMA_BASE_URL``, default ``http://localhost:11434/v1``, as ``eg.Agent``);
* ``"sentence-transformers:<name or path>"``: a local model through the
  optional ``sentence-transformers`` package.

The string is the embedder's ``name``, which a store records when it is first
filled: vectors of two names are never compared, and a store opened without
an embedder uses the one it was filled with. ``engrain memory reembed`` moves
a store to another (:mod:`.reembed`).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from .._errors import ConfigError, EmbeddingError
from .embed import DEFAULT_NAME, QUANTIZED_NAME, SHIPPED_NAME, Embedder, _normalize, default_embedder

#: Prefixes of a model string, besides the default's names.
PROVIDERS = ("openai", "ollama", "sentence-transformers")
DEFAULT_NAMES = ("default", "minilm", DEFAULT_NAME)
FP32_NAMES = ("minilm-fp32", SHIPPED_NAME)
QUANTIZED_NAMES = ("minilm-int8", QUANTIZED_NAME)
#: The shipped MiniLM's model strings, each with how it computes the file (:class:`.embed.MiniLMEmbedder`).
LOCAL = {**dict.fromkeys(DEFAULT_NAMES, "block"), **dict.fromkeys(FP32_NAMES, "fp32"),
         **dict.fromkeys(QUANTIZED_NAMES, "dynamic")}
#: Dimensions of OpenAI's models (others are measured with one request on first use).
OPENAI_DIMS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}
OLLAMA_URL = "http://localhost:11434/v1"
#: Texts per request and characters per text sent to a remote embedder (servers refuse larger inputs).
BATCH, MAX_CHARS = 128, 8000


class RemoteEmbedder:
    """An OpenAI-compatible embeddings endpoint through the official ``openai`` SDK.

    ``dim`` is known for OpenAI's own models, else measured by embedding one
    text on first access. Rows are L2-normalised (some servers do not).
    """

    def __init__(self, name: str, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 dim: int | None = None, batch_size: int = BATCH):
        self.name = name
        self.model = model
        self.base_url = base_url
        self.api_key = api_key
        self.batch_size = batch_size
        self._dim = dim
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self._request(["dimension"]).shape[1])
        return self._dim

    def _request(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            if self._client is None:
                try:
                    import openai
                except ImportError as e:
                    raise EmbeddingError(f"the embedder {self.name!r} needs the openai package: pip install openai") from e
                self._client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key or
                                             os.environ.get("OPENAI_API_KEY") or "unused")
        try:
            resp = self._client.embeddings.create(model=self.model, input=[t[:MAX_CHARS] or " " for t in texts])
        except Exception as e:  # the SDK's errors (connection, status, timeout) all say what failed
            raise EmbeddingError(f"embedder {self.name!r} at {self.base_url or 'api.openai.com'}: {e}") from e
        rows = sorted(resp.data, key=lambda d: d.index)
        if len(rows) != len(texts):
            raise EmbeddingError(f"embedder {self.name!r} returned {len(rows)} vectors for {len(texts)} texts")
        return np.asarray([d.embedding for d in rows], dtype=np.float32)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` into unit rows, ``batch_size`` texts per request."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = [self._request(texts[i:i + self.batch_size]) for i in range(0, len(texts), self.batch_size)]
        out = np.concatenate(parts)
        if self._dim is None:
            self._dim = out.shape[1]
        elif out.shape[1] != self._dim:
            raise EmbeddingError(f"embedder {self.name!r} returned {out.shape[1]}-dimensional vectors, "
                                 f"expected {self._dim}")
        return _normalize(out)


class SentenceTransformerEmbedder:
    """A local model through the optional ``sentence-transformers`` package (loaded on first use).

    Retrieval models trained with a query and a document prompt keep them in
    their config (EmbeddingGemma: ``"task: search result | query: "`` and
    ``"title: none | text: "``): ``embed_query`` embeds with the first, ``embed``
    (what memory stores) with the second, through ``encode_query`` /
    ``encode_document`` (sentence-transformers >= 5) or ``encode(prompt_name=...)``
    on older versions, so the vectors do not depend on the installed version.
    A model without such prompts embeds both sides alike. ``prompts=False``
    ignores them (a comparison in ``bench/memory_quality.py``): its vectors are
    another space, so give it a ``name`` of its own.
    """

    def __init__(self, name: str, model: str, *, prompts: bool = True):
        self.name = name
        self.model = model
        self.prompts = prompts
        self._m: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._m is None:
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as e:
                    raise EmbeddingError(f"the embedder {self.name!r} needs the optional sentence-transformers "
                                         "package: pip install sentence-transformers") from e
                try:
                    self._m = SentenceTransformer(self.model)
                except Exception as e:  # a bad name or path, a missing file
                    raise EmbeddingError(f"embedder {self.name!r}: cannot load {self.model!r}: {e}") from e
            return self._m

    @property
    def dim(self) -> int:
        m = self._load()
        get = getattr(m, "get_embedding_dimension", None) or getattr(m, "get_sentence_embedding_dimension", None)
        dim = get() if get else None
        return int(dim) if dim else int(np.asarray(m.encode(["dimension"])).shape[1])

    def _encode(self, texts: list[str], side: str) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        m = self._load()
        if not self.prompts:
            out = m.encode(list(texts), prompt="")  # "" also overrides a default prompt the config may name
        elif callable(getattr(m, f"encode_{side}", None)):
            out = getattr(m, f"encode_{side}")(list(texts))
        elif side in (getattr(m, "prompts", None) or {}):
            out = m.encode(list(texts), prompt_name=side)
        else:
            out = m.encode(list(texts))
        return _normalize(np.asarray(out, dtype=np.float32))

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` as documents (the model's document prompt, if it has one) into unit rows."""
        return self._encode(texts, "document")

    def embed_query(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` as search queries (the model's query prompt, if it has one) into unit rows."""
        return self._encode(texts, "query")


def resolve(spec: str | Embedder | None, *, base_url: str | None = None, api_key: str | None = None) -> Embedder:
    """The embedder ``spec`` names (see the module docstring); an :class:`Embedder` object is returned as is.

    None is ``$ENGRAIN_EMBEDDER`` when set, else the default. ``base_url`` and
    ``api_key`` apply to ``openai:`` and ``ollama:`` (``$OPENAI_BASE_URL`` /
    ``$OPENAI_API_KEY`` otherwise, as the SDK reads them).
    """
    if spec is not None and not isinstance(spec, str):
        if not isinstance(spec, Embedder):
            raise ConfigError(f"embedder must be a model string or an object with name, dim and embed(), "
                              f"not {type(spec).__name__}")
        return spec
    if spec is None:
        spec = os.environ.get("ENGRAIN_EMBEDDER") or "default"
        if spec == "openai":  # the older spelling of $ENGRAIN_EMBEDDER
            spec = "openai:text-embedding-3-small"
    text = spec.strip()
    if text in LOCAL:
        return default_embedder(compute=LOCAL[text])
    provider, _, model = text.partition(":")
    if provider not in PROVIDERS or not model.strip():
        raise ConfigError(f"embedder {spec!r}: write 'default', 'minilm-fp32', 'minilm-int8', or '<provider>:<model>' with "
                          f"provider one of {', '.join(PROVIDERS)} (e.g. 'openai:text-embedding-3-small')")
    model = model.strip()
    if provider == "openai":
        return RemoteEmbedder(text, model, base_url=base_url, api_key=api_key, dim=None if base_url or
                              os.environ.get("OPENAI_BASE_URL") else OPENAI_DIMS.get(model))
    if provider == "ollama":
        return RemoteEmbedder(text, model, base_url=base_url or os.environ.get("OLLAMA_BASE_URL") or OLLAMA_URL,
                              api_key=api_key or "ollama")
    return SentenceTransformerEmbedder(text, model)


def is_spec(name: str) -> bool:
    """Whether a store's recorded embedder name is a model string :func:`resolve` can build."""
    provider, _, model = name.partition(":")
    return name in LOCAL or (provider in PROVIDERS and bool(model))
