"""Which new records are about one subject: the clustering behind article formation.

The cut is not a tuned constant but a property of the embedder. Every model
has its own baseline of similarity between texts that have nothing to do
with each other (MiniLM's is near 0.04, OpenAI's embeddings sit near 0.7), so
a fixed cosine would mean "related" for one model and "anything" for another.
:func:`related_cut` embeds :data:`UNRELATED`, a set of sentences on unrelated
subjects from many domains, and takes the :data:`NULL_QUANTILE` quantile of
their pairwise cosines: two texts above it are more alike than 99 in 100
pairs of unrelated texts, so the chance of joining two unrelated facts is
about 1 % per pair. For MiniLM this gives 0.28.

Records are grouped by average-linkage agglomeration with that cut: the two
groups whose mean pairwise cosine is highest merge, until no pair of groups
is related. Average linkage (not single) keeps one borderline pair from
chaining two subjects together; the cut applies to the mean, so every group
is on average more alike than unrelated text.

A label given at deposit (``remember(..., label="refunds")``) is the
depositor's own statement of topic: groups whose records carry different
labels never merge (a cannot-link constraint), however alike their wording.

A record that opens with a pronoun ("It receives 7 million visitors a year")
has no subject of its own: it continues the record deposited just before it
in the same skill. Its clustering vector is its own plus that record's, the
way a reader resolves "it" from the previous sentence. The stored embedding
is left unchanged.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence

import numpy as np

from .embed import embed_queries

#: Quantile of unrelated-pair similarity used as the "related" cut.
NULL_QUANTILE = 0.99

#: A pronoun-led record continues the previous deposit of its skill if that came at most this long before (s).
CONTINUATION_WINDOW = 600.0

UNRELATED = (
    "Deploys to production happen every Tuesday after the change review.",
    "The invoice total must include VAT for customers in Germany.",
    "Our cat sleeps on the radiator when the flat gets cold.",
    "The API returns HTTP 429 when a client exceeds 100 requests per minute.",
    "Grandmother's lasagne recipe uses nutmeg in the béchamel.",
    "Mount Kilimanjaro is the highest mountain in Africa.",
    "The quarterly sales meeting moved to the third floor conference room.",
    "Use a torque wrench to tighten the bicycle's carbon seat post.",
    "Photosynthesis converts light energy into chemical energy in chloroplasts.",
    "Ann prefers window seats on long-haul flights.",
    "The backup job failed because the disk quota was exceeded.",
    "Jazz emerged in New Orleans in the early twentieth century.",
    "Water the tomato plants in the morning to avoid mildew.",
    "The contract renewal deadline for ACME is the end of March.",
    "Chess openings like the Sicilian Defence favour counterattack.",
    "The printer on level two jams when the paper is damp.",
    "Bananas are botanically berries while strawberries are not.",
    "Passwords must be rotated every ninety days under the security policy.",
    "The marathon route passes along the river embankment.",
    "Customers in the trial plan cannot export reports as PDF.",
    "The violin was tuned a semitone flat for the baroque concert.",
    "Interest rates rose by a quarter point at the last central bank meeting.",
    "The onboarding checklist asks new hires to set up two-factor authentication.",
    "Penguins huddle together to survive Antarctic winters.",
    "The staging database is refreshed from a production snapshot every night.",
    "He learned to knit from a video series during the winter.",
    "The museum is closed on Mondays except during school holidays.",
    "Support tickets tagged urgent must get a first reply within an hour.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Tokyo's subway system carries millions of passengers each day.",
    "The logo must not be stretched or recoloured in marketing material.",
    "Volcanic soil is unusually fertile for vineyards.",
    "The team retrospective is held on the last Friday of each sprint.",
    "Bob is allergic to peanuts and carries an epinephrine injector.",
    "The hiking trail is closed after heavy rain because of rockfall.",
    "Solar panels lose efficiency as their temperature rises.",
    "The warehouse ships orders placed before 2 pm on the same day.",
    "Medieval monks copied manuscripts by hand in scriptoria.",
    "The mobile app crashes on Android 12 when the camera permission is denied.",
    "A good espresso extraction takes about twenty-five seconds.",
    "The library lends e-readers to members for three weeks.",
    "Shakespeare wrote Hamlet around the year 1600.",
    "Refunds over 500 euros need approval from a finance manager.",
    "Our neighbour's dog barks whenever the postman arrives.",
    "The wind farm off the coast produces power for forty thousand homes.",
    "Kubernetes pods restart automatically when the liveness probe fails.",
    "The children's choir rehearses in the school gym on Thursdays.",
    "Saffron is harvested by hand from crocus flowers.",
)

_PRONOUN = re.compile(r"^\W*(it|its|it's|they|their|them|he|his|him|she|her|this|these|those)\b", re.I)
_cuts: dict[str, tuple[float, float, float]] = {}
_cuts_lock = threading.Lock()


def related_cut(embedder: object, *, query: bool = False) -> float:
    """The cosine above which two texts count as related, for ``embedder`` (computed once per model name).

    ``query=True``: the cut for a search query (embedded on the query side of an
    asymmetric model, :func:`.embed.embed_queries`) against stored text, from
    the cosines of each unrelated sentence as a query against the others as
    documents: the two sides of such a model have their own baseline.
    """
    return _null(embedder, query)[0]


def null_spread(embedder: object) -> float:
    """The standard deviation of ``embedder``'s query-to-record cosines between unrelated texts: the scale of
    its cosines, measured on fixed text whatever its retrieval quality (recall's text weight reads it)."""
    return _null(embedder, True)[1]


def null_documents(embedder: object) -> tuple[float, float]:
    """``(mean, std)`` of ``embedder``'s cosines between unrelated texts stored as documents: where its
    baseline sits and how wide it is, so a mean cosine between stored records (a skill's crowding) can be
    read in another model's units."""
    _, std, mean = _null(embedder, False)
    return mean, std


def _null(embedder: object, query: bool) -> tuple[float, float, float]:
    """``(cut, std, mean)`` of the cosines between :data:`UNRELATED` sentences, query side against documents
    when ``query`` and the embedder has a query side, else documents against documents."""
    sided = callable(getattr(embedder, "embed_query", None))
    query = query and sided  # one side only: the same figures
    name = str(getattr(embedder, "name", type(embedder).__name__))
    key = f"{name}\0query" if query else name
    with _cuts_lock:
        if key not in _cuts:
            v = np.asarray(embedder.embed(list(UNRELATED)), dtype=np.float32)  # type: ignore[attr-defined]
            both = {name: (v @ v.T)[np.triu_indices(len(UNRELATED), 1)]}
            if sided:  # both sides' figures from one embedding of the documents
                q = np.asarray(embed_queries(embedder, list(UNRELATED)), dtype=np.float32)
                both[f"{name}\0query"] = (q @ v.T)[~np.eye(len(UNRELATED), dtype=bool)]
            for k, sims in both.items():
                _cuts.setdefault(k, (float(np.quantile(sims, NULL_QUANTILE)), float(sims.std()), float(sims.mean())))
        return _cuts[key]


def continues(text: str) -> bool:
    """Whether ``text`` opens with a pronoun, i.e. takes its subject from the text before it."""
    return bool(_PRONOUN.match(text))


def _unit(v: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(v))
    return (v / n).astype(np.float32) if n > 0 else v.astype(np.float32)


def context_vectors(texts: Sequence[str], vecs: np.ndarray, times: Sequence[float],
                    prev: Sequence[int | None]) -> np.ndarray:
    """Clustering vectors: a pronoun-led text leans on its predecessor (``prev[i]``, an index or None)."""
    out = np.array(vecs, dtype=np.float32, copy=True)
    for i, t in enumerate(texts):
        j = prev[i]
        if j is not None and continues(t) and 0 <= times[i] - times[j] <= CONTINUATION_WINDOW:
            out[i] = _unit(out[j] + out[i])
    return out


def average_linkage(vecs: np.ndarray, cut: float, labels: Sequence[str] | None = None) -> list[list[int]]:
    """Groups of row indices: merge the pair of groups with the highest mean cosine while it is >= ``cut``.

    Quadratic in the number of groups per merge; a pass clusters one skill's
    new records, and :data:`MAX_AGGLOMERATE` bounds it (beyond, a greedy
    centre assignment with the same cut takes over).
    """
    n = len(vecs)
    if n == 0:
        return []
    sim = np.asarray(vecs @ vecs.T, dtype=np.float64)
    groups: list[list[int]] = [[i] for i in range(n)]
    # Sum of pairwise cosines between groups; the mean is sum / (|a|·|b|).
    between = sim.copy()
    sizes = np.ones(n)
    alive = np.ones(n, dtype=bool)
    tags = [{labels[i].strip().lower()} - {""} if labels else set() for i in range(n)]
    apart = np.zeros((n, n), dtype=bool)  # cannot-link: both groups labelled, with no label in common
    for i in range(n):
        for j in range(i + 1, n):
            apart[i, j] = apart[j, i] = bool(tags[i] and tags[j] and not tags[i] & tags[j])
    while alive.sum() > 1:
        mean = between / np.outer(sizes, sizes)
        mean[~alive, :] = -np.inf
        mean[:, ~alive] = -np.inf
        mean[apart] = -np.inf
        np.fill_diagonal(mean, -np.inf)
        a, b = np.unravel_index(int(np.argmax(mean)), mean.shape)
        if mean[a, b] < cut:
            break
        a, b = min(a, b), max(a, b)
        groups[a] += groups[b]
        groups[b] = []
        between[a, :] += between[b, :]
        between[:, a] += between[:, b]
        sizes[a] += sizes[b]
        alive[b] = False
        if tags[b]:
            tags[a] |= tags[b]
            for c in range(n):
                apart[a, c] = apart[c, a] = bool(tags[a] and tags[c] and not tags[a] & tags[c])
    return [sorted(g) for g in groups if g]


#: Past this many new records in one skill, clustering is greedy (one pass) instead of agglomerative.
MAX_AGGLOMERATE = 400


def greedy(vecs: np.ndarray, cut: float, labels: Sequence[str] | None = None) -> list[list[int]]:
    """One pass: each row joins the group whose centre is most similar (>= ``cut``), else starts one."""
    groups: list[list[int]] = []
    centres: list[np.ndarray] = []
    tag = [labels[i].strip().lower() if labels else "" for i in range(len(vecs))]
    for i, v in enumerate(vecs):
        sims = [-1.0 if tag[i] and tag[g[0]] and tag[i] != tag[g[0]] else float(c @ v) for g, c in zip(groups, centres)]
        j = int(np.argmax(sims)) if sims else -1
        if j >= 0 and sims[j] >= cut:
            groups[j].append(i)
            centres[j] = _unit(np.mean(vecs[groups[j]], axis=0))
        else:
            groups.append([i])
            centres.append(v)
    return groups


def cluster(vecs: np.ndarray, cut: float, labels: Sequence[str] | None = None) -> list[list[int]]:
    """Groups of related rows (average linkage, or greedy for very large batches); see the module docstring."""
    if len(vecs) <= MAX_AGGLOMERATE:
        return average_linkage(vecs, cut, labels)
    return greedy(vecs, cut, labels)
