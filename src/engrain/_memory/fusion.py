"""How much the full-text half weighs in a recall, per query (used by :meth:`Memory.recall`).

The vector half's cosines say how much the embedder tells candidates apart:
on text in its element (English chat with MiniLM) the top 40 cosines of a
query spread with a standard deviation of ~0.08; on words it does not know
(Swedish legal terms, product codes, jargon) they bunch at ~0.025, and its
order among them is close to noise. That spread is a standard score-based
predictor of how well a query's dense search went, so the text weight is set
from it: ``W_TEXT_REF * (SPREAD_REF / spread) ** SPREAD_POWER``, capped at ``W_TEXT_MAX``.
Where the embedder discriminates, BM25 only breaks near-ties (a fixed 0.20 let
weak word matches outrank better cosine hits, below dense alone); where it
cannot, matching words decide.

Chosen on bench/memory_quality.py's conversations (chitchat-dataset) and
checked on its second set (the zaragoza-construction-faq Q&As, Swedish and
English), where no fixed weight served both: 0.05 matched dense on the chats
but lost to BM25 on the Swedish set, 0.20 the reverse. LoCoMo's long
conversations (records that open with speaker and date bunch MiniLM's
cosines at a spread of ~0.04, and its dense search is weaker than BM25 there)
asked for more text weight at that spread than the square gave: the cube
gives it (0.08 -> 0.10) while the chats (spread ~0.077) keep ~0.014.

The spread is one query's view; a skill's records also say, all at once, how
well the embedder tells them apart: their *crowding*, the mean cosine between
two of them (:func:`crowding`). Where every record opens with the same
speaker-and-date header, or is written in a language the model does not know,
their vectors share most of their direction (LoCoMo's conversations 0.42-0.53,
the Swedish FAQ 0.46) and the cosines order them poorly however they spread;
where the embedder is at home they do not (the chats 0.09-0.15, the English FAQ
0.17). So the weight never falls below ``W_TEXT_FLOOR`` (the fixed weight recall
had before it was set per query) times ``min(1, (crowding / CROWDING_REF) ** 3)``:
the full floor on crowded skills, next to nothing on the others. The per-query
weight alone gave some LoCoMo questions whose top cosines spread widely a text
weight of 0.01-0.04, and those questions ranked better at 0.20 (any@5 0.754 ->
0.805, session-hit@1 0.737 -> 0.814 on the third of them with the widest
spread), while the chats and the English FAQ lose at 0.20 (-0.03 any@5).
Measured (bench/memory_quality.py, all four sets in one run, any@5 all@5 any@10
session-hit@1): LoCoMo dev 0.684 0.554 0.788 0.667 -> 0.692 0.565 0.811 0.706;
FAQ sv any@5 0.528 -> 0.534; the chats and the English FAQ unchanged.

The spread is in the embedder's cosine units, and models differ in scale
(EmbeddingGemma's query-to-document cosines between unrelated texts spread
0.061, MiniLM's 0.084), so the reference spread is taken in units of the
embedder's own null spread (:func:`.cluster.null_spread`, the std of cosines
between the unrelated sentences that also set the clustering cut): ``scale``
is that over MiniLM's (:data:`NULL_SPREAD_REF`), 1 for the default embedder.
A skill's crowding is read the same way, from the embedder's baseline and
width between unrelated documents (:func:`in_reference_units`).
Measured on the four sets of bench/memory_quality.py, it changes nothing for
MiniLM and raises or holds EmbeddingGemma-300M's any@5 on each (LoCoMo dev
.771 -> .771, FAQ sv .728 -> .760, FAQ en .863 -> .871, chat slice .385 -> .408;
without its prompts LoCoMo .729 -> .740, FAQ sv .722 -> .762, en .861 -> .875,
chat .254 -> .262).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

#: Text weight at the reference spread, and the spread (std of the top cosines) taken as reference.
W_TEXT_REF, SPREAD_REF = 0.05, 0.05
#: How steeply the weight grows as the spread shrinks.
SPREAD_POWER = 3
#: Ceiling of the text weight (a query whose top cosines are all equal).
W_TEXT_MAX = 0.5
#: Cosines the spread is measured over: the best this many vector hits of the query.
SPREAD_DEPTH = 40
#: Fewer vector hits than this: too few to measure a spread; the reference weight applies.
SPREAD_MIN = 5
#: Least text weight on a skill whose records crowd (the fixed weight recall had before it was set per query).
W_TEXT_FLOOR = 0.20
#: Crowding (mean cosine between two records of a skill) at and above which the whole floor applies.
CROWDING_REF = 0.40
#: Records a skill's crowding is measured on: its most recent ones, at most this many.
CROWDING_SAMPLE = 512


def crowding(total: np.ndarray, squares: float, n: int) -> float:
    """Mean cosine between two distinct vectors of a sample of ``n`` unit vectors with this sum and sum of squared norms.

    ``|sum|^2`` adds every ordered pair's dot product and each vector's own
    (``squares``); the rest, over the ``n (n - 1)`` pairs, is the mean. 0.0 for fewer than two.
    """
    if n < 2:
        return 0.0
    return float((float(np.dot(total, total)) - squares) / (n * (n - 1)))


#: The default MiniLM's null spread (:func:`.cluster.null_spread`), the unit SPREAD_REF was chosen in. These two
#: are the integer-compute default's (0.3 % and 0.5 % under the fp32 computation's 0.0842 and 0.0383, whose units
#: the constants were chosen in), so the default's units are exactly 1; on the four quality sets the change moved
#: one question of 2,000 for the fp32 computation ("minilm-fp32": FAQ sv any@5 .534 -> .536).
NULL_SPREAD_REF = 0.08397417515516281
#: The default MiniLM's mean cosine between unrelated documents (:func:`.cluster.null_documents`; its std
#: there is NULL_SPREAD_REF): CROWDING_REF was chosen in the units these two set.
NULL_MEAN_REF = 0.03813081607222557


def in_reference_units(crowd: float, mean: float, std: float) -> float:
    """A skill's :func:`crowding` by an embedder whose unrelated documents' cosines have this ``mean`` and
    ``std`` (:func:`.cluster.null_documents`), read in the default MiniLM's units: the same distance from
    the baseline, in baseline widths. Models whose cosines bunch high whatever the text (or use a narrow
    range) would otherwise look crowded everywhere; for MiniLM it is the identity."""
    if std <= 0.0:
        return crowd
    return NULL_MEAN_REF + (crowd - mean) * NULL_SPREAD_REF / std


def text_weight(cosines: Iterable[float], crowding: float = 0.0, scale: float = 1.0) -> float:
    """The full-text weight for a query whose vector hits have these cosines (any order), in a skill whose
    records have this :func:`crowding` (0 when unknown: the per-query weight alone).

    ``scale``: the embedder's null spread over :data:`NULL_SPREAD_REF` (its cosines' scale against MiniLM's).
    """
    top = np.sort(np.fromiter(cosines, dtype=np.float64))[::-1][:SPREAD_DEPTH]
    floor = W_TEXT_FLOOR * min(1.0, max(0.0, crowding) / CROWDING_REF) ** 3
    if len(top) < SPREAD_MIN:
        return max(floor, W_TEXT_REF)
    spread = float(top.std())
    if spread <= 0.0:
        return W_TEXT_MAX
    return max(floor, min(W_TEXT_MAX, W_TEXT_REF * (SPREAD_REF * scale / spread) ** SPREAD_POWER))


def recall_text_weight(cosines: Iterable[float], crowding: float = 0.0, scale: float = 1.0) -> float:
    """The text weight recall fuses with ``W_VECTOR * cos``: :func:`text_weight` times ``scale``.

    An embedder whose cosines differ by ``scale`` times MiniLM's between the
    same texts gets ``scale`` times the weight, so words and vectors keep the
    balance they have for MiniLM (for which this is :func:`text_weight`).
    Measured with EmbeddingGemma-300M (bench/memory_quality.py, 2026-11-27):
    LoCoMo dev any@5 .751 -> .763 and session-hit@1 .737 -> .754, FAQ sv .762
    -> .766, FAQ en .871 -> .875, against the weight unscaled.
    """
    return scale * text_weight(cosines, crowding, scale)

