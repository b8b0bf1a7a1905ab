"""Model, tokenizer and checkpoint of an LLM cell, as torchtune config sections.

- CUDA cells train Llama3-8B (torchtune's ``llama3_8b`` family): from the
  user's checkpoint directory (``llm_checkpoint_dir``; Meta
  ``consolidated.00.pth`` or Hugging Face safetensors) when given, otherwise
  from random weights written once into the cache (bf16, ~16 GB).
- CPU cells train a tiny Llama3 of the same architecture (GQA, RoPE, SwiGLU,
  RMSNorm; 2 layers, ~2.2 M parameters) from cached random weights. Its
  sizes keep every quantised weight's numel a multiple of 64 x 256, which
  QLoRA's NF4 needs, and every linear input a multiple of QAT's group size.
- The tokenizer is the user's Llama3 ``tokenizer.model`` (``llm_tokenizer``,
  or ``original/tokenizer.model`` inside the checkpoint directory) or the
  small BPE the project ships (``llm_tokenizer.py``).

Random weights are N(0, 0.02) (norm scales 1): the speed of a step does not
depend on the values, and the loss starts near ln(vocab) and falls.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torchtune.training import (
    FullModelHFCheckpointer,
    FullModelMetaCheckpointer,
    FullModelTorchTuneCheckpointer,
)

from perfsuite.workloads import llm_data, llm_tokenizer

# A tiny Llama3: sizes from torchtune's llama3 builder arguments.
TINY_LLAMA3 = {"vocab_size": 2048, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
               "embed_dim": 256, "max_seq_len": 512, "intermediate_dim": 512}
LLAMA3_8B_BUILDERS = {"base": "torchtune.models.llama3.llama3_8b",
                      "lora": "torchtune.models.llama3.lora_llama3_8b",
                      "qlora": "torchtune.models.llama3.qlora_llama3_8b"}
TINY_BUILDERS = {"base": "torchtune.models.llama3.llama3",
                 "lora": "torchtune.models.llama3.lora_llama3",
                 "qlora": "torchtune.models.llama3.lora_llama3"}
RANDOM_CHECKPOINT_FILE = "model.pt"
INIT_STD = 0.02


def model_size(cell_device: str, options: dict[str, str]) -> str:
    """``tiny`` on CPU, ``8b`` on CUDA; ``llm_model`` (tiny|8b) overrides."""
    chosen = options.get("llm_model") or ("8b" if cell_device == "cuda" else "tiny")
    if chosen not in ("tiny", "8b"):
        raise ValueError(f"llm_model must be 'tiny' or '8b', not {chosen!r}")
    return chosen


def model_section(size: str, kind: str, lora_keys: dict[str, Any]) -> dict[str, Any]:
    """The ``model`` config: ``kind`` is base (full fine-tune), lora or qlora."""
    if size == "8b":
        section = {"_component_": LLAMA3_8B_BUILDERS[kind]}
    else:
        section = {"_component_": TINY_BUILDERS[kind], **TINY_LLAMA3}
        if kind == "qlora":
            section["quantize_base"] = True
    return {**section, **(lora_keys if kind != "base" else {})}


def build_base_model(size: str):
    """The base model on the meta device: names and shapes, no memory."""
    import torch
    from torchtune.models.llama3 import llama3, llama3_8b

    with torch.device("meta"):
        return llama3_8b() if size == "8b" else llama3(**TINY_LLAMA3)


def parameter_count(size: str) -> int:
    return sum(p.numel() for p in build_base_model(size).parameters())


def random_checkpoint(size: str, cache_dir: Path) -> Path:
    """A directory with torchtune-format random weights of the base model."""
    import torch

    directory = Path(cache_dir) / "llm" / "checkpoints" / f"llama3-{size}-random-v1"
    target = directory / RANDOM_CHECKPOINT_FILE
    with llm_data.file_lock(directory.parent / f".{directory.name}.lock"):
        if target.exists():
            return directory
        dtype = torch.bfloat16 if size == "8b" else torch.float32  # 8B: half the disk
        gen = torch.Generator().manual_seed(0)
        state = {}
        for name, meta in build_base_model(size).state_dict().items():
            if name.endswith("scale"):  # RMSNorm
                state[name] = torch.ones(meta.shape, dtype=dtype)
            else:
                state[name] = (torch.randn(meta.shape, generator=gen) * INIT_STD).to(dtype)
        tmp = directory / f".{RANDOM_CHECKPOINT_FILE}.{os.getpid()}.tmp"
        directory.mkdir(parents=True, exist_ok=True)
        try:
            torch.save(state, tmp)
            os.replace(tmp, target)
        except BaseException:  # a full disk: no partial checkpoint left in the cache
            tmp.unlink(missing_ok=True)
            raise
    return directory


def _user_checkpoint(path: Path) -> dict[str, Any]:
    """Checkpointer keys for a Meta or Hugging Face Llama3-8B directory."""
    for directory in (path, path / "original"):
        if (directory / "consolidated.00.pth").is_file():
            return {"kind": "meta", "checkpoint_dir": str(directory),
                    "checkpoint_files": ["consolidated.00.pth"]}
    shards = sorted(p.name for p in path.glob("*.safetensors"))
    if shards and (path / "config.json").is_file():
        return {"kind": "hf", "checkpoint_dir": str(path), "checkpoint_files": shards}
    raise FileNotFoundError(
        f"llm_checkpoint_dir={path} holds neither a Meta checkpoint (consolidated.00.pth, "
        "also under original/) nor Hugging Face safetensors with config.json; download "
        "meta-llama/Meta-Llama-3-8B(-Instruct) there or leave the option unset for random "
        "weights")


# A measurement does not need the fine-tuned weights, and an 8B model is 16-32
# GB per cell; the recipe's steps are over before ``save_checkpoint`` is called.
class SkipSaveTorchTuneCheckpointer(FullModelTorchTuneCheckpointer):
    """Loads as torchtune does; does not write the trained model."""

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        pass


class SkipSaveMetaCheckpointer(FullModelMetaCheckpointer):
    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        pass


class SkipSaveHFCheckpointer(FullModelHFCheckpointer):
    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        pass


_CHECKPOINTERS = {
    ("torchtune", False): "perfsuite.workloads.llm_assets.SkipSaveTorchTuneCheckpointer",
    ("meta", False): "perfsuite.workloads.llm_assets.SkipSaveMetaCheckpointer",
    ("hf", False): "perfsuite.workloads.llm_assets.SkipSaveHFCheckpointer",
    ("torchtune", True): "torchtune.training.FullModelTorchTuneCheckpointer",
    ("meta", True): "torchtune.training.FullModelMetaCheckpointer",
    ("hf", True): "torchtune.training.FullModelHFCheckpointer",
}


def checkpointer_section(size: str, options: dict[str, str], cache_dir: Path,
                         output_dir: Path) -> tuple[dict[str, Any], str]:
    """The ``checkpointer`` config and a line saying which weights it loads.

    ``llm_save_checkpoint=1`` keeps torchtune's saving checkpointers.
    """
    save = options.get("llm_save_checkpoint", "0").lower() in ("1", "true", "yes")
    user_dir = options.get("llm_checkpoint_dir")
    if user_dir and size == "8b":
        found = _user_checkpoint(Path(user_dir).expanduser())
        kind = found.pop("kind")
        origin = f"{kind} checkpoint {found['checkpoint_dir']}"
    else:
        directory = random_checkpoint(size, cache_dir)
        kind, found = "torchtune", {"checkpoint_dir": str(directory),
                                    "checkpoint_files": [RANDOM_CHECKPOINT_FILE]}
        origin = f"random weights {directory}"
    section = {"_component_": _CHECKPOINTERS[(kind, save)], **found,
               "recipe_checkpoint": None, "output_dir": str(output_dir),
               "model_type": "LLAMA3"}
    return section, origin


def tokenizer_section(size: str, options: dict[str, str], max_seq_len: int
                      ) -> tuple[dict[str, Any], str]:
    """The ``tokenizer`` config; ``max_seq_len`` 0 keeps torchtune's default (none)."""
    path = options.get("llm_tokenizer")
    if not path and options.get("llm_checkpoint_dir") and size == "8b":
        beside = Path(options["llm_checkpoint_dir"]).expanduser() / "original" / "tokenizer.model"
        path = str(beside) if beside.is_file() else None
    if size == "tiny" and max_seq_len <= 0:
        max_seq_len = TINY_LLAMA3["max_seq_len"]  # RoPE's table ends there
    section: dict[str, Any] = {"_component_": "torchtune.models.llama3.llama3_tokenizer",
                               "max_seq_len": max_seq_len or None}
    if path:
        if not Path(path).expanduser().is_file():
            raise FileNotFoundError(f"llm_tokenizer={path} is not a file; give the path of a "
                                    "Llama3 tokenizer.model or leave the option unset")
        if size == "tiny":
            raise ValueError("the tiny CPU model has 2048 embedding rows and cannot take "
                             "Llama3's 128K-token tokenizer; unset llm_tokenizer or use "
                             "llm_model=8b")
        return {**section, "path": str(Path(path).expanduser())}, f"Llama3 tokenizer {path}"
    section.update(path=str(llm_tokenizer.TOKENIZER_FILE),
                   special_tokens_path=str(llm_tokenizer.SPECIAL_TOKENS_FILE))
    return section, f"shipped {llm_tokenizer.vocab_size()}-token BPE"
