"""LLM fine-tuning cells: torchtune's own recipes, run as their users run them.

Techniques (the cell's ``strategy``) and the recipes that run them:

=========  ===============================  =================================
technique  1 rank                           2+ ranks
=========  ===============================  =================================
lora       lora_finetune_single_device      lora_finetune_distributed
qlora      lora_finetune_single_device      lora_finetune_distributed
           (model ``quantize_base``)        (model ``quantize_base``)
dpo        lora_dpo_single_device           lora_dpo_distributed
qat        qat_distributed (one rank)       qat_distributed
qat-lora   qat_lora_finetune_distributed    qat_lora_finetune_distributed
=========  ===============================  =================================

Each rank (a process torch.distributed.run started; the worker does not
start a process group for these cells, the distributed recipes do) writes
the recipe's YAML config into the cell directory (``llm-recipe-rank<N>.yaml``)
and calls the recipe's ``recipe_main`` with it in-process, exactly as ``tune
run <recipe> --config <file>`` would. What the suite adds is all in that
config as component paths: a metric logger that timestamps every step
(``llm_watch.StepLogger``), a collate function that notes batch shapes, and
checkpointers that skip writing the trained model. ``llm_compat`` patches the
few places where torchtune 0.6.1 cannot run here (CPU, torchao 0.13, one
rank), outside the training math. How metrics are derived: ``llm_metrics``.

Options (``RankContext.options``): ``llm_checkpoint_dir``, ``llm_tokenizer``,
``llm_data_dir`` (real model, tokenizer, data), ``llm_model`` (tiny|8b),
``llm_save_checkpoint`` (1 keeps torchtune's saving), ``cache_dir`` (where
generated data and random weights go; else perfsuite.context.default_cache_dir():
$PERFSUITE_CACHE_DIR, else ~/.cache/perfsuite, outside the checkout).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Nothing may be fetched from a hub: Hugging Face libraries read these when
# first imported (below, through torchtune), so they are set before that.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from perfsuite.extras import require

# Without the llm extra the cell fails with the sentence that names it, not
# with an ImportError from deep inside torchtune's imports.
require("llm")

from perfsuite.profiling.torch_profile import StepProfiler  # noqa: E402
from perfsuite.rank.counting import DEFAULT_WINDOW_STEPS, OptimizerStepWindow  # noqa: E402
from perfsuite.workloads import (  # noqa: E402
    llm_assets,
    llm_compat,
    llm_config,
    llm_metrics,
    llm_watch,
)


def run_recipe(recipe_module: Any, config_path: Path) -> None:
    """``tune run <recipe> --config <config_path>``, inside this process."""
    argv = sys.argv
    sys.argv = ["tune", "--config", str(config_path)]
    try:
        recipe_module.recipe_main()
    except SystemExit as done:  # torchtune's config.parse ends with sys.exit(...)
        if done.code not in (None, 0):
            raise RuntimeError(f"{recipe_module.__name__} exited with {done.code!r}") from None
    finally:
        sys.argv = argv


def model_facts(plan: llm_config.RecipePlan) -> dict[str, Any]:
    """Parameter counts for FLOPs, from the model built on the meta device."""
    import torch
    from omegaconf import OmegaConf
    from torchtune import config as tt_config

    base = llm_assets.build_base_model(plan.model_size)
    total = sum(p.numel() for p in base.parameters())
    embedding = base.tok_embeddings.weight.numel()
    adapters = 0
    if plan.config["model"]["_component_"].split(".")[-1] not in ("llama3", "llama3_8b"):
        section = {k: v for k, v in plan.config["model"].items() if k != "quantize_base"}
        section["_component_"] = section["_component_"].replace("qlora_", "lora_")
        with torch.device("meta"):
            tuned = tt_config.instantiate(OmegaConf.create(section))
        adapters = sum(p.numel() for n, p in tuned.named_parameters() if "lora_" in n)
    width = base.tok_embeddings.weight.shape[1]
    return {"params": total, "matmul_params": total - embedding, "adapter_params": adapters,
            "trainable_params": adapters or total, "layers": len(base.layers), "width": width}


# Profiled steps: a window, not the run. The trace and its summary grow with
# every step's events: ~4 000 CPU events a step for the 2-layer CPU model;
# the 8B model has 32 layers and, on a GPU, a launch and a kernel per op.
# `--option profile_steps=N` asks for another window.
PROFILED_STEPS = 5


def _step_profiler(cell: Any, ctx: Any, distributed: bool):
    """The launcher's profiler choice, windowed on the first measured steps.

    It steps with the recipe's step log, which distributed recipes write on
    rank 0 only: under torch.profiler the profile covers rank 0 and the
    other ranks run none (one that never steps records nothing). Under nsys
    every rank has its own capture, which opens and closes where its
    profiler does: those ranks step with their optimizer (_profiler_steps).
    """
    warmup = min(cell.warmup_steps, 1)
    steps = cell.max_steps * cell.epochs if cell.max_steps > 0 else 10**9
    window = int(ctx.options.get("profile_steps", PROFILED_STEPS))
    profiler = StepProfiler.from_env(rank=ctx.rank, wait=max(cell.warmup_steps - warmup, 0), warmup=warmup,
                                     active=max(min(window, steps - cell.warmup_steps), 1),
                                     cuda=cell.device == "cuda")
    if distributed and ctx.rank != 0 and profiler.mode == "torch":
        return StepProfiler("off", rank=ctx.rank)
    return profiler


@contextlib.contextmanager
def _profiler_steps(profiler: Any, distributed: bool, rank: int) -> Iterator[None]:
    """Step ``profiler`` after each step the recipe logs; on the ranks of a
    distributed recipe that log none, after each optimizer step (torch's
    global hook, as the counting window counts them)."""
    if not distributed or rank == 0:
        with llm_watch.stepping(profiler.step):
            yield
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(lambda *_: profiler.step())
    try:
        yield
    finally:
        handle.remove()


def counting_steps(cell: Any, options: dict[str, str]) -> int:
    """Steps of the counting window: after the cell's own steps, so the recipe
    runs that many more (and one between, uncounted, so no timed step's end
    falls inside the window). A recipe caps steps per epoch, so only
    one-epoch cells with a step cap get a window."""
    if cell.epochs != 1 or cell.max_steps <= 0:
        return 0
    return int(options.get("count_steps", DEFAULT_WINDOW_STEPS))


def run(cell: Any, ctx: Any) -> dict[str, Any]:
    """Run ``cell`` on this rank; returns metrics, measured steps and info."""
    import torch

    if ctx.world_size != cell.world_size:
        raise ValueError(f"cell {cell.id} wants {cell.world_size} ranks, launched with "
                         f"{ctx.world_size}")
    if cell.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"cell {cell.id} needs CUDA, and torch sees no GPU")
    window = counting_steps(cell, ctx.options)
    ran = cell.replace(max_steps=cell.max_steps + window + 1) if window else cell
    plan = llm_config.build_plan(ran, ctx.rank, ctx.world_size, Path(ctx.out_dir),
                                 dict(ctx.options), ctx.cache_dir,
                                 seed=getattr(ctx, "seed", 0))
    llm_config.write_config(plan)
    if cell.device == "cuda":
        torch.cuda.set_device(ctx.local_rank)  # recipes use the current device
    recipe = llm_config.load_recipe(plan.recipe)
    profiler = _step_profiler(cell, ctx, plan.distributed)
    with llm_compat.recipe_compat(recipe, cell.device, cell.strategy,
                                  plan.distributed) as patched, \
            llm_watch.observe(recipe, cell.pin_memory) as watched, \
            profiler, _profiler_steps(profiler, plan.distributed, ctx.rank), \
            OptimizerStepWindow(cell.max_steps + 1, window, torch.device(ctx.device)) as counted:
        run_recipe(recipe, plan.config_path)
    summary = profiler.summary()
    # the first batch collated: where the recipe's set-up ended (wall clock, as the record's)
    first_batch = llm_watch.BATCHES[0]["t"] if llm_watch.BATCHES else None
    training_started = (time.time() - (time.perf_counter() - first_batch)
                        if first_batch is not None else None)
    # the steps after the cell's own ran for the counting window: not timed
    full_log = llm_watch.read_step_log(plan.step_log)
    step_log = full_log[:cell.max_steps if window else None]
    batches = llm_watch.trained_batches(list(llm_watch.BATCHES), ran.epochs,
                                        ran.max_steps)[:cell.max_steps if window else None]
    facts = model_facts(plan)
    metrics, steps, measured_info = llm_metrics.summarise(
        technique=cell.strategy, recipe=plan.recipe, device=torch.device(ctx.device),
        world_size=ctx.world_size, warmup=cell.warmup_steps, epochs=cell.epochs,
        step_log=step_log, batches=batches, model_facts=facts, precision=cell.precision)
    info = {**plan.info, **measured_info, **watched, "model_params": facts["params"],
            "trainable_params": facts["trainable_params"], "config_file": str(plan.config_path),
            "step_log": str(plan.step_log) if step_log else None,
            "compat_patches": patched, "count_window_steps": window,
            "training_started": training_started,
            "train_s": step_log[-1]["t"] - step_log[0]["t"] if len(step_log) > 1 else None,
            "count_window_s": (full_log[-1]["t"] - full_log[len(step_log)]["t"]
                               if len(full_log) > len(step_log) else 0.0),
            "saves_checkpoint": "SkipSave" not in plan.config["checkpointer"]["_component_"]}
    return {"metrics": metrics, "steps": steps, "info": info, "counters": counted.result(),
            "profile": summary.to_dict() if summary else None}

