"""The shipped small tokenizer: a byte-level BPE in Llama3's file format.

Llama3's real tokenizer (128K tokens) cannot be downloaded here, so the suite
ships its own, trained on the project's generated text with Llama3's own
pre-tokenisation pattern, and written as Llama3 writes ``tokenizer.model``
(one ``base64(token) rank`` line per token), so that torchtune's
``llama3_tokenizer`` loads it unchanged. Its 256 special tokens (Llama3's
names) get the ids right after the BPE ranks through ``special_tokens.json``
(Hugging Face's ``added_tokens`` layout); without it they would sit at
128000+ and overflow the tiny model's 2048-row embedding.

Rebuild the shipped files (deterministic) with::

    python -m perfsuite.workloads.llm_tokenizer
"""

from __future__ import annotations

import base64
import collections
import itertools
import json
from pathlib import Path

from perfsuite.workloads import llm_data

TOKENIZER_DIR = llm_data.DATA_DIR / "tokenizer"
TOKENIZER_FILE = TOKENIZER_DIR / "tokenizer.model"
SPECIAL_TOKENS_FILE = TOKENIZER_DIR / "special_tokens.json"
VOCAB_LIMIT = 2048  # the tiny model's embedding rows: BPE ranks + 256 special tokens
MAX_MERGES = VOCAB_LIMIT - 256 - 256
TRAINING_ROWS = 300  # per dataset


def llama3_special_token_names() -> list[str]:
    """Llama3's 256 special tokens in torchtune's order."""
    from torchtune.models.llama3._tokenizer import LLAMA3_SPECIAL_TOKENS

    return sorted(LLAMA3_SPECIAL_TOKENS, key=LLAMA3_SPECIAL_TOKENS.get)


def training_text() -> str:
    rows = []
    for name, to_text in llm_data.TEXT_COLUMNS.items():
        rows += [to_text(row) for row in llm_data.generate_rows(name, TRAINING_ROWS, seed=7)]
    return "\n".join(rows)


def train_bpe(text: str, merges: int) -> dict[bytes, int]:
    """Byte-level BPE: ranks 0-255 are the bytes, then one rank per merge.

    Words are Llama3's pre-tokens, so no token crosses their boundaries.
    """
    import regex
    from torchtune.models.llama3._tokenizer import CL100K_PATTERN

    counts = collections.Counter(regex.findall(CL100K_PATTERN, text))
    words = [[bytes([b]) for b in w.encode()] for w in counts]
    freqs = list(counts.values())
    ranks = {bytes([b]): b for b in range(256)}
    for _ in range(merges):
        pairs: collections.Counter = collections.Counter()
        for symbols, freq in zip(words, freqs):
            for pair in itertools.pairwise(symbols):
                pairs[pair] += freq
        if not pairs:
            break  # every pre-token is one token already
        # The most frequent pair; ties go to the smaller bytes, so the result is deterministic.
        (left, right), _count = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merged = left + right
        ranks[merged] = len(ranks)
        for symbols in words:
            i = 0
            while i < len(symbols) - 1:
                if symbols[i] == left and symbols[i + 1] == right:
                    symbols[i:i + 2] = [merged]
                i += 1
    return ranks


def write_tokenizer(ranks: dict[bytes, int], directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    model = directory / TOKENIZER_FILE.name
    lines = (f"{base64.b64encode(tok).decode()} {rank}"
             for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]))
    model.write_text("\n".join(lines) + "\n")
    specials = directory / SPECIAL_TOKENS_FILE.name
    added = [{"id": len(ranks) + i, "content": name}
             for i, name in enumerate(llama3_special_token_names())]
    specials.write_text(json.dumps({"added_tokens": added}, indent=0) + "\n")
    return model, specials


def vocab_size(tokenizer_file: Path = TOKENIZER_FILE) -> int:
    """BPE ranks plus special tokens: the embedding rows a model needs."""
    ranks = sum(1 for line in tokenizer_file.read_text().splitlines() if line.strip())
    return ranks + len(llama3_special_token_names())


def build(directory: Path = TOKENIZER_DIR) -> tuple[Path, Path]:
    return write_tokenizer(train_bpe(training_text(), MAX_MERGES), directory)


if __name__ == "__main__":
    paths = build()
    print(f"wrote {paths[0]} and {paths[1]}; vocab size {vocab_size(paths[0])}")
