"""Datasets of the LLM cells: the real Hugging Face data when a runner has a
local copy, otherwise rows generated here in each dataset's own schema.

Generated rows are pseudo-English (words from ``data/llm/words.txt`` drawn
with Zipf frequencies) whose *lengths* follow the real datasets: each text
field's length in characters is drawn from a log-normal distribution whose
mean comes from the dataset's published size. What matters for a performance
measurement is the token count per sample (it sets the sequence length of a
step), not the meaning of the words. Where the means come from:

- alpaca-cleaned (yahma/alpaca-cleaned): 51,760 rows; a copy with the same
  three text columns plus one int32 column has ``num_bytes`` 40,490,946 on
  its dataset card, about 765 characters per row. Split between the fields
  as instruction ~70, input ~45 (about 60 % of rows have an empty input),
  output ~650 characters (our estimate of the split).
- SAMSum (Samsung/samsum): 16,369 dialogues in 10.71 MB (paper 2503.15252,
  Table 4), about 650 characters per row: dialogue ~530 (the SAMSum paper
  describes chats of 3-30 utterances), summary ~110.
- grammar (liweili/c4_200m): one C4 sentence per side. The card gives no
  per-row size; the paper's 3,710.5 MB for 185 M pairs is the compressed
  download, so we assume ~110 characters per side (a typical web sentence).
- SlimOrca-Dedup (Open-Orca/SlimOrca-Dedup): ``num_bytes`` 600,511,805 for
  363,491 rows on its card, about 1,650 characters per row: system ~150,
  human ~650, gpt ~800 (our estimate of the split).
- stack-exchange-paired (lvwerra/stack-exchange-paired), the preference data
  of torchtune's DPO configs: question ~900 and each answer ~800 characters
  (our estimate; questions and answers there often carry code). Chosen and
  rejected answers are the same kind of text with the same length
  distribution, so they have the same tokens (as in the real data, where
  both are answers to the question); what a model can learn to prefer is
  their words: chosen answers draw from one half of the vocabulary, rejected
  ones from the other (``text_of_length``'s ``half``), both Zipf-weighted.
  (Version 2 rejected answers in capitals: ~1.3 characters per token
  against ~4, so a DPO step carried ~1.5x the tokens of the real data's
  and a technique comparison per iteration weighed DPO's inflated budget.)

The log-normal spreads (sigma 0.4-0.8) are approximations, not fitted to the
real data. The resulting order of mean tokens per sample is
slimorca > alpaca > samsum > grammar, as in the paper's Fig. 4 iteration times.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate
from pathlib import Path
from typing import Any

from perfsuite.system.atomic import atomic_write_text

DATA_DIR = Path(__file__).parent / "data" / "llm"
GENERATOR_VERSION = 3  # bump when generated rows change: it is part of the file name
DEFAULT_GENERATED_ROWS = 1024

NAMES = ("Anna", "Tom", "Kate", "John", "Maria", "Peter", "Lucy", "Mark", "Emma", "Jack",
         "Olivia", "Adam", "Sophie", "Daniel", "Julia", "Chris", "Laura", "Ben", "Eva", "Max")


@dataclass(frozen=True)
class FieldShape:
    """Length of one text field: log-normal in characters."""

    mean_chars: float
    sigma: float
    empty_share: float = 0.0  # rows where the field is the empty string

    def draw(self, rng: random.Random) -> int:
        if self.empty_share and rng.random() < self.empty_share:
            return 0
        mean_nonempty = self.mean_chars / (1.0 - self.empty_share)
        mu = math.log(mean_nonempty) - self.sigma ** 2 / 2  # E[lognormal] = mean_nonempty
        return max(8, int(rng.lognormvariate(mu, self.sigma)))


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    builder: str  # torchtune dataset builder, a config component path
    hf_source: str  # the Hugging Face dataset torchtune's builder reads by default
    train_rows: int  # rows of the real training split
    kind: str  # "sft" or "preference"
    shapes: dict[str, FieldShape] = field(default_factory=dict)
    builder_args: dict[str, Any] = field(default_factory=dict)


DATASETS: dict[str, DatasetSpec] = {
    "alpaca": DatasetSpec(
        "alpaca", "torchtune.datasets.alpaca_cleaned_dataset", "yahma/alpaca-cleaned", 51_760,
        "sft", {"instruction": FieldShape(70, 0.4), "input": FieldShape(45, 0.7, 0.6),
                "output": FieldShape(650, 0.8)}),
    "samsum": DatasetSpec(
        "samsum", "torchtune.datasets.samsum_dataset", "Samsung/samsum", 14_732, "sft",
        {"dialogue": FieldShape(530, 0.6), "summary": FieldShape(110, 0.45)}),
    "grammar": DatasetSpec(
        "grammar", "torchtune.datasets.grammar_dataset", "liweili/c4_200m", 185_000_000, "sft",
        {"output": FieldShape(110, 0.5)}),
    "slimorca": DatasetSpec(
        "slimorca", "torchtune.datasets.slimorca_dataset", "Open-Orca/SlimOrca-Dedup", 363_491,
        "sft", {"system": FieldShape(150, 0.5, 0.1), "human": FieldShape(650, 0.8),
                "gpt": FieldShape(800, 0.8)}),
    "stack_exchange_paired": DatasetSpec(
        "stack_exchange_paired", "torchtune.datasets.stack_exchange_paired_dataset",
        "lvwerra/stack-exchange-paired", 7_400_000, "preference",  # data/rl: ~7.4 M
        {"question": FieldShape(900, 0.7), "response_j": FieldShape(800, 0.8),
         "response_k": FieldShape(800, 0.8)}),
}


def spec(name: str) -> DatasetSpec:
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown LLM dataset {name!r}; known: {sorted(DATASETS)}") from None


# ----------------------------------------------------------- text generation
@lru_cache(maxsize=3)
def _vocabulary(half: int | None = None) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The words in order of frequency and their Zipf cumulative weights;
    ``half`` 0 or 1: every other word from that one on (two disjoint
    vocabularies with the same mix of short, frequent and long, rare words)."""
    lines = (DATA_DIR / "words.txt").read_text().splitlines()
    words = tuple(dict.fromkeys(w.strip() for w in lines if w.strip() and not w.startswith("#")))
    if half is not None:
        words = words[half::2]
    # Zipf's law: the r-th most frequent word has weight 1 / (r + 2.7).
    cum = tuple(accumulate(1.0 / (rank + 2.7) for rank in range(len(words))))
    return words, cum


def _sentence(rng: random.Random, words: list[str]) -> str:
    body = " ".join(words)
    end = "?" if rng.random() < 0.12 else "."
    return body[:1].upper() + body[1:] + end


def text_of_length(rng: random.Random, chars: int, half: int | None = None) -> str:
    """Sentences of Zipf-drawn words, cut at a word boundary near ``chars``
    (words of one half of the vocabulary with ``half``: ``_vocabulary``).
    Draws as many random numbers whatever ``half`` is."""
    if chars <= 0:
        return ""
    vocab, cum = _vocabulary(half)
    pool = rng.choices(vocab, cum_weights=cum, k=chars // 4 + 8)  # >= words needed
    sentences, current, length, i = [], [], 0, 0
    while length < chars and i < len(pool):
        word = pool[i] if rng.random() > 0.02 else str(rng.randint(2, 1999))
        current.append(word)
        length += len(word) + 1
        i += 1
        if len(current) >= rng.randint(6, 22):
            sentences.append(_sentence(rng, current))
            current = []
    if current:
        sentences.append(_sentence(rng, current))
    return " ".join(sentences)


def _dialogue(rng: random.Random, chars: int) -> str:
    speakers = rng.sample(NAMES, rng.choice((2, 2, 2, 3, 4)))
    lines, length = [], 0
    while length < chars:
        line = f"{rng.choice(speakers)}: {text_of_length(rng, rng.randint(15, 90))}"
        lines.append(line)
        length += len(line) + 2
    return "\r\n".join(lines)  # SAMSum separates utterances with CRLF


def _corrupt(rng: random.Random, sentence: str) -> str:
    """A grammatical error or two: drop, repeat or swap words (C4_200M style)."""
    words = sentence.split()
    for _ in range(rng.randint(1, 2)):
        if len(words) < 3:
            break
        i = rng.randrange(len(words) - 1)
        op = rng.random()
        if op < 0.4:
            del words[i]
        elif op < 0.7:
            words.insert(i, words[i])
        else:
            words[i], words[i + 1] = words[i + 1], words[i]
    return " ".join(words)


def _row(name: str, rng: random.Random, index: int) -> dict[str, Any]:
    shapes = DATASETS[name].shapes
    draw = {key: shape.draw(rng) for key, shape in shapes.items()}
    if name == "alpaca":
        return {"instruction": text_of_length(rng, draw["instruction"]),
                "input": text_of_length(rng, draw["input"]),
                "output": text_of_length(rng, draw["output"])}
    if name == "samsum":
        return {"id": f"{13_680_000 + index:08d}", "dialogue": _dialogue(rng, draw["dialogue"]),
                "summary": text_of_length(rng, draw["summary"])}
    if name == "grammar":
        clean = text_of_length(rng, draw["output"])
        return {"input": _corrupt(rng, clean), "output": clean}
    if name == "slimorca":
        turns = [{"from": "human", "value": text_of_length(rng, draw["human"])},
                 {"from": "gpt", "value": text_of_length(rng, draw["gpt"])}]
        if draw["system"]:
            turns.insert(0, {"from": "system", "value": text_of_length(rng, draw["system"])})
        return {"conversations": turns}
    if name == "stack_exchange_paired":
        # Chosen and rejected answers: the same kind of lower-case text, the
        # same length distribution and so the same tokens per answer (a DPO
        # step's budget as with the real data); their words come from the two
        # halves of the vocabulary, a preference a model can learn, so a short
        # DPO run shows its loss falling. (Rejected answers in capitals, as in
        # version 2, tokenised at ~1.3 characters per token against ~4: ~3x
        # the chosen answer's tokens, which weighed on DPO's step time.)
        return {"qid": index, "question": text_of_length(rng, draw["question"]),
                "response_j": text_of_length(rng, draw["response_j"], half=0),
                "response_k": text_of_length(rng, draw["response_k"], half=1)}
    raise ValueError(f"no generator for dataset {name!r}")


def generate_rows(name: str, rows: int, seed: int = 0) -> list[dict[str, Any]]:
    """``rows`` rows in the schema of ``name``; the same arguments give the same rows."""
    spec(name)
    rng = random.Random(f"perfsuite-llm-{name}-{seed}")
    return [_row(name, rng, i) for i in range(rows)]


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """One rank writes a cache entry while the other ranks wait for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def generated_file(name: str, rows: int, cache_dir: Path) -> Path:
    """The JSONL file of ``rows`` generated rows, written once into the cache."""
    path = Path(cache_dir) / "llm" / "data" / f"{name}-{rows}-v{GENERATOR_VERSION}.jsonl"
    with file_lock(path.parent / f".{path.name}.lock"):
        if not path.exists():
            lines = (json.dumps(row, ensure_ascii=False) for row in generate_rows(name, rows))
            atomic_write_text(path, "\n".join(lines) + "\n")
    return path


# ---------------------------------------------------- real data on the runner
_FILE_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _user_candidates(name: str, data_dir: Path) -> list[Path]:
    repo = DATASETS[name].hf_source
    stems = [name, repo.split("/")[-1]]
    files = [data_dir / f"{stem}{suffix}" for stem in stems for suffix in _FILE_SUFFIXES]
    return files + [data_dir / repo, data_dir / repo.split("/")[-1]]


def dataset_source(name: str, llm_data_dir: str | None, rows_needed: int,
                   cache_dir: Path) -> tuple[dict[str, Any], str]:
    """Config keys for torchtune's builder of ``name``, and where its rows come from.

    With ``llm_data_dir`` the real data is required (a file ``<name>.jsonl``,
    ``.json``, ``.parquet`` or ``.csv``, or a directory holding a local copy
    of the Hugging Face dataset); a missing one is an error, never a silent
    fall back to generated rows.
    """
    ds = spec(name)
    base: dict[str, Any] = {"_component_": ds.builder, **ds.builder_args}
    if llm_data_dir:
        root = Path(llm_data_dir).expanduser()
        for candidate in _user_candidates(name, root):
            if candidate.is_file():
                return ({**base, "source": _FILE_SUFFIXES[candidate.suffix],
                         "data_files": str(candidate), "split": "train"}, f"file {candidate}")
            if candidate.is_dir():
                return {**base, "source": str(candidate), "split": "train"}, f"copy {candidate}"
        tried = ", ".join(str(p) for p in _user_candidates(name, root))
        raise FileNotFoundError(
            f"dataset {name!r} not found under llm_data_dir={root}; tried {tried}. Put the "
            f"Hugging Face dataset {ds.hf_source!r} (a local snapshot directory or one "
            f"{name}.jsonl file in its own columns) there, or leave llm_data_dir unset to use "
            "generated rows")
    rows = max(DEFAULT_GENERATED_ROWS, rows_needed)
    path = generated_file(name, rows, cache_dir)
    return ({**base, "source": "json", "data_files": str(path), "split": "train"},
            f"generated {rows} rows ({path})")


def rows_needed(max_steps: int, batch_size: int, world_size: int, epochs: int,
                dataset: str) -> int:
    """Generated rows a cell needs: its capped steps, or the real split for a full epoch."""
    if max_steps > 0:
        return max_steps * batch_size * world_size
    real = spec(dataset).train_rows
    if real > 2_000_000:
        raise ValueError(f"a full epoch of {dataset!r} ({real:,} rows) cannot be generated; "
                         "set max_steps or give the real data through llm_data_dir")
    return real


TEXT_COLUMNS: dict[str, Callable[[dict[str, Any]], str]] = {
    "alpaca": lambda r: " ".join((r["instruction"], r["input"], r["output"])),
    "samsum": lambda r: r["dialogue"] + " " + r["summary"],
    "grammar": lambda r: r["input"] + " " + r["output"],
    "slimorca": lambda r: " ".join(t["value"] for t in r["conversations"]),
    "stack_exchange_paired": lambda r: " ".join((r["question"], r["response_j"],
                                                 r["response_k"])),
}
