"""Out of tinyrl: `tinyrl export` (a merged Hugging Face model) and `tinyrl export-verl` (a verl
recipe, when one card is not enough)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

import typer

from tinyrl.cli.common import SetOpt, app, err, log_to_stderr, out, said_if_stopped, stops_cleanly, typed
from tinyrl.errors import TinyRLError


@app.command()
def export(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="A run directory written by `tinyrl train`."),
    out_dir: Path = typer.Option(..., "--out", help="Where to write the merged Hugging Face model (a new or empty directory)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write into a non-empty --out (never the run directory)."),
    dtype: str = typer.Option("float32", "--dtype", help="float32: the merge exactly as trained (a 3B model: ~12 GB). "
                              "base: the base model's own dtype, bf16 for Qwen2.5 (~6 GB), each merged weight rounded once."),
) -> None:
    """Write the run's latest actor as a merged Hugging Face model (base + actor adapter).

    Example (bf16, half the disk): tinyrl export runs/countdown-4090 --out countdown-4090-model --dtype base
    """
    from tinyrl.export import export_run, weights_on_disk

    # the model is written into a hidden folder in --out and moved in whole (tinyrl.writable.staged)
    with said_if_stopped(f" while exporting {run_dir}; nothing was written in {out_dir}"):
        path = export_run(run_dir, out_dir, overwrite=overwrite, dtype=dtype)
    out.print(f"wrote {path} ({weights_on_disk(path)}): load it with AutoModelForCausalLM.from_pretrained({str(path)!r})",
              highlight=False, soft_wrap=True, markup=False)


@app.command("export-verl")
@functools.partial(stops_cleanly, after=" while exporting the verl recipe; nothing was changed in --out "
                   "(its files move in together)")
def export_verl_cmd(
    out_dir: Path = typer.Option(..., "--out", help="Directory for the recipe: run_verl.sh, reward_fn.py, data/ and what else it needs."),
    preset: Optional[str] = typer.Option(None, "--preset", "-p", help="Preset name or .toml path (or --from-run)."),
    overrides: Optional[list[str]] = SetOpt,
    from_run: Optional[Path] = typer.Option(None, "--from-run", help="Export a run's settings (RUN_DIR/config.json)."),
    actor: Optional[Path] = typer.Option(None, "--actor", help="Start verl from this model instead of the base: a "
                                         "Hugging Face model directory such as `tinyrl export RUN --out DIR`'s DIR "
                                         "(a run directory is refused)."),
    gpus: int = typer.Option(1, "--gpus", help="GPUs per node (trainer.n_gpus_per_node)."),
    nodes: int = typer.Option(1, "--nodes", help="Nodes (trainer.nnodes)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the exported files in a non-empty --out."),
) -> None:
    """When one GPU is not enough: the same job as a verl (multi-GPU) recipe, every setting mapped.

    Example: tinyrl export-verl --preset countdown-4090 --gpus 8 --out verl-countdown

    Example (a run's settings, on 2 nodes): tinyrl export-verl --from-run runs/countdown-4090 --gpus 8 --nodes 2 --out verl-run
    """
    from tinyrl.config import load_config
    from tinyrl.export_verl import config_of_run, export_verl

    if (preset is None) == (from_run is None):
        raise TinyRLError("give exactly one of --preset NAME or --from-run RUN_DIR",
                          hint="e.g. tinyrl export-verl --preset countdown-4090 --gpus 8 --out verl-countdown")
    log_to_stderr()  # warnings (a run's file read from here, ...) as train and eval print them
    cfg = config_of_run(from_run, typed(overrides)) if from_run else load_config(preset, typed(overrides))
    names: list[str] = []
    path = export_verl(cfg, out_dir, gpus=gpus, nodes=nodes, overwrite=overwrite, actor=actor,
                       source=f"run {from_run}" if from_run else f"preset {cfg.preset}",
                       warn=lambda w: err.print(w, style="yellow", highlight=False, soft_wrap=True, markup=False),
                       wrote=names.extend)
    from rich.markup import escape  # a path's [brackets] are not markup

    out.print(f"wrote {escape(str(path))}/{', '.join(names[:-1])} and {names[-1]}: run [bold]bash "
              f"{escape(str(path))}/run_verl.sh[/] where verl is installed", soft_wrap=True, highlight=False)
