"""Synthetic text corpora, preference pairs and text-quality measures for the SLM pipeline.

Three domains, each a family of templates filled from word lists with a seed, so a document
is grammatical, internally consistent (a story's hero keeps their name, a town's council
votes on the town's plan) and split into a ``prompt`` (its first sentence) and a
``continuation`` (the rest):

- ``story``: a short fable (an animal, a routine, a find, an ending).
- ``news``: a council decision with a one-line ``summary :`` at the end.
- ``facts``: an encyclopedic entry on a place (kind, region, population, landmark, year).

:func:`preference_pairs` builds pairs the way Haque, Islam and Karray (SMC 2026) do: the real
document is *chosen*; the *rejected* one is the same document with its sentences shuffled and
truncated, with a mismatched ending (another document's summary or last sentence), or with
words dropped. Text is lower-case words separated by spaces, ``.`` and ``:`` their own
words, so the project's word-level tokenizer (:func:`corpus_words`) covers it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "DOMAINS",
    "Doc",
    "Pair",
    "corpus_words",
    "distinct_n",
    "make_corpus",
    "preference_pairs",
    "sentences",
    "win_rate",
]

_NAMES = [
    "ada",
    "ben",
    "cleo",
    "dan",
    "eve",
    "finn",
    "gus",
    "hana",
    "ivo",
    "juno",
    "kai",
    "lena",
    "milo",
    "nora",
    "otto",
    "pia",
]
_ANIMALS = ["fox", "rabbit", "owl", "bear", "otter", "mouse", "deer", "badger", "heron", "goat"]
_ADJ = ["curious", "shy", "brave", "clever", "sleepy", "kind", "quiet", "proud"]
_PLACES = ["forest", "valley", "meadow", "hill", "marsh", "orchard"]
_ROUTINES = [
    "walked to the river",
    "gathered berries",
    "sang by the old tree",
    "counted the clouds",
    "visited a friend",
    "looked for seeds",
]
_OBJECTS = ["lantern", "key", "map", "shell", "feather", "bell", "stone", "ribbon"]
_LANDMARKS = ["old bridge", "tall oak", "stone wall", "quiet pond", "broken fence", "red barn"]
_ENDINGS = {
    "lantern": "never feared the dark again",
    "key": "opened every door with care",
    "map": "explored the far side of the hills",
    "shell": "listened to the sea each night",
    "feather": "dreamed of flying",
    "bell": "rang it to call the others home",
    "stone": "kept it as a lucky charm",
    "ribbon": "tied it to the door for luck",
}

_CITIES = ["brook", "harbor", "millfield", "ashton", "riverton", "oakdale", "northgate", "westport"]
_DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday"]
_PLANS = [  # (verb phrase, summary verb, facility)
    ("build", "build", "schools"),
    ("open", "open", "libraries"),
    ("repair", "repair", "bridges"),
    ("close", "close", "parks"),
    ("build", "build", "bike lanes"),
    ("open", "open", "clinics"),
]
_REACTIONS_NEWS = ["welcomed", "questioned", "protested", "celebrated"]

_KINDS = {  # kind -> (region words, what it is known for)
    "city": (["north", "south", "west"], ["markets", "bridges", "museums", "festivals"]),
    "river": (["north", "east", "lowlands"], ["floods", "fish", "waterfalls", "mills"]),
    "mountain": (["west", "highlands", "north"], ["glaciers", "caves", "trails", "peaks"]),
    "island": (["south", "east", "west"], ["beaches", "birds", "lighthouses", "reefs"]),
}
_ENTITIES = [
    "kalo",
    "venri",
    "tasmor",
    "eldun",
    "sabri",
    "morvel",
    "lundra",
    "osk",
    "ferran",
    "talis",
    "quarn",
    "belmo",
    "isvik",
    "corran",
    "dalmi",
    "ystra",
]


@dataclass(frozen=True)
class Doc:
    """One document: ``text == prompt + " " + continuation``."""

    domain: str
    prompt: str
    continuation: str

    @property
    def text(self) -> str:
        return f"{self.prompt} {self.continuation}"


@dataclass(frozen=True)
class Pair:
    """A preference pair over one prompt: ``chosen`` is preferred to ``rejected``."""

    prompt: str
    chosen: str  # full texts, prompt included
    rejected: str
    kind: str  # shuffle | mismatch | drop


def _pick(rng: np.random.Generator, items):
    return items[int(rng.integers(len(items)))]


def _story(rng: np.random.Generator) -> list[str]:
    name, animal, adj = _pick(rng, _NAMES), _pick(rng, _ANIMALS), _pick(rng, _ADJ)
    obj = _pick(rng, _OBJECTS)
    return [
        f"{name} was a {adj} {animal} who lived in the {_pick(rng, _PLACES)} .",
        f"every morning {name} {_pick(rng, _ROUTINES)} .",
        f"one day {name} found a {obj} near the {_pick(rng, _LANDMARKS)} .",
        f"the {animal} took the {obj} home .",
        f"from that day on {name} {_ENDINGS[obj]} .",
    ]


def _news(rng: np.random.Generator) -> list[str]:
    city, day = _pick(rng, _CITIES), _pick(rng, _DAYS)
    verb, short, facility = _pick(rng, _PLANS)
    n, cost, years = int(rng.integers(2, 9)), int(rng.integers(2, 40)), int(rng.integers(1, 6))
    return [
        f"the {city} council voted on {day} to {verb} {n} {facility} .",
        f"the mayor said the plan will cost {cost} million and take {years} years .",
        f"residents {_pick(rng, _REACTIONS_NEWS)} the decision .",
        f"summary : {city} will {short} {n} {facility} .",
    ]


def _facts(rng: np.random.Generator) -> list[str]:
    kind = _pick(rng, list(_KINDS))
    regions, known = _KINDS[kind]
    name = _pick(rng, _ENTITIES)
    population = int(rng.integers(2, 99))
    return [
        f"{name} is {'an' if kind[0] in 'aeiou' else 'a'} {kind} in the {_pick(rng, regions)} .",
        f"about {population} thousand people live near the {kind} .",
        f"{name} is best known for its {_pick(rng, known)} .",
        f"the {kind} was first recorded in {int(rng.integers(1200, 1900))} .",
    ]


DOMAINS = {"story": _story, "news": _news, "facts": _facts}


def make_corpus(domain: str, n: int, seed: int) -> list[Doc]:
    """``n`` documents of ``domain``; the same ``(domain, n, seed)`` gives the same list."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}: choose from {', '.join(DOMAINS)}")
    rng = np.random.default_rng([seed, list(DOMAINS).index(domain)])
    docs = []
    for _ in range(n):
        sents = DOMAINS[domain](rng)
        docs.append(Doc(domain, sents[0], " ".join(sents[1:])))
    return docs


def sentences(text: str) -> list[str]:
    """Split on the ``.`` word; each sentence keeps its full stop."""
    out, cur = [], []
    for w in text.split():
        cur.append(w)
        if w == ".":
            out.append(" ".join(cur))
            cur = []
    if cur:
        out.append(" ".join(cur))
    return out


def corpus_words() -> list[str]:
    """Every word any domain can write (for the word-level tokenizer)."""
    words: set[str] = set()
    for domain in DOMAINS:
        for seed in range(4):  # the templates' fixed words, and the lists' words below
            for doc in make_corpus(domain, 50, seed):
                words.update(doc.text.split())
    lists = [_NAMES, _ANIMALS, _ADJ, _PLACES, _OBJECTS, _CITIES, _DAYS, _REACTIONS_NEWS, _ENTITIES]
    phrases = [*_ROUTINES, *_LANDMARKS, *_ENDINGS.values(), *(" ".join(p) for p in _PLANS)]
    for kind, (regions, known) in _KINDS.items():
        lists += [[kind], regions, known]
    words.update(w for lst in lists for w in lst)
    words.update(w for p in phrases for w in p.split())
    words.update(str(i) for i in range(1200, 1900))
    words.update(str(i) for i in range(100))
    return sorted(words)


def _corrupt(doc: Doc, kind: str, others: list[Doc], rng: np.random.Generator) -> str:
    sents = sentences(doc.text)
    if kind == "shuffle":  # the sentences out of order, and cut short
        order = rng.permutation(len(sents))
        while len(sents) > 1 and (order == np.arange(len(sents))).all():
            order = rng.permutation(len(sents))
        words = " ".join(sents[i] for i in order).split()
        keep = max(3, int(len(words) * rng.uniform(0.5, 0.8)))
        return " ".join(words[:keep])
    if kind == "mismatch":  # another document's last sentence (a news item's summary)
        candidates = [o for o in others if sentences(o.text)[-1] != sents[-1]]
        if not candidates:
            raise ValueError("mismatch needs another document with a different ending")
        return " ".join([*sents[:-1], sentences(_pick(rng, candidates).text)[-1]])
    if kind == "drop":  # about a third of the words after the prompt left out
        head, tail = doc.prompt.split(), doc.continuation.split()
        keep = rng.random(len(tail)) >= 0.35
        if keep.all():
            keep[int(rng.integers(len(tail)))] = False
        return " ".join(head + [w for w, k in zip(tail, keep, strict=True) if k])
    raise ValueError(f"unknown corruption {kind!r}: shuffle, mismatch or drop")


def preference_pairs(
    docs: list[Doc], seed: int, kinds=("shuffle", "mismatch", "drop")
) -> list[Pair]:
    """One pair per document, the corruption drawn from ``kinds`` in turn.

    The rejected text always differs from the chosen one; the prompt of a pair is the
    document's prompt (a shuffled text may not start with it: the reward model must read it).
    """
    rng = np.random.default_rng(seed)
    pairs = []
    for i, doc in enumerate(docs):
        kind = kinds[i % len(kinds)]
        rejected = _corrupt(doc, kind, docs, rng)
        pairs.append(Pair(doc.prompt, doc.text, rejected, kind))
    return pairs


def distinct_n(texts: list[str], n: int) -> float:
    """Distinct-n (Li et al., 2016): distinct n-grams over all n-grams of ``texts``; 0 when
    there are none."""
    grams = [
        tuple(words[i : i + n])
        for words in (t.split() for t in texts)
        for i in range(len(words) - n + 1)
    ]
    return len(set(grams)) / len(grams) if grams else 0.0


def win_rate(delta: float, std_a: float, std_b: float) -> float:
    """The analytic win rate ``Φ(Δ / sqrt(σ_a² + σ_b²))``: P(score_b > score_a) for two
    independent normal scores whose means differ by ``Δ = μ_b - μ_a``; 0.5 when both spreads
    are 0 and Δ = 0."""
    scale = math.sqrt(std_a**2 + std_b**2)
    if scale == 0:
        return 0.5 if delta == 0 else float(delta > 0)
    return 0.5 * (1.0 + math.erf(delta / scale / math.sqrt(2.0)))
