"""``rollout-router simulate``: arguments and entry point (wired by router/cli.py)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from .. import usage
from .cost import CostModel
from .grid import GRIDS
from .runner import Config, arms_for, resolve_presets, run_study
from .verlgrid import VERL_GRIDS
from .workload import PRESETS

STUDY_PRESETS = ["ctx2k", "ctx9k", "ctx20k", "ctx9k-bigkv"]

COST_HELP = {  # CostModel's fields, as --help describes them (docs/simulator.md has their sources)
    "layers": "transformer layers", "hidden": "hidden size", "kv_heads": "KV heads (GQA)",
    "head_dim": "dimension of one attention head", "dtype_bytes": "bytes per weight and KV element (bf16: 2)",
    "params": "model parameters", "linear_flops_per_token": "FLOPs of the linear layers per token",
    "tp": "tensor-parallel GPUs per replica", "peak_flops": "peak dense FLOP/s per GPU",
    "mfu": "share of peak FLOP/s reached (model FLOPs utilisation)", "hbm_bw": "HBM bytes/s per GPU",
    "bw_eff": "share of HBM bandwidth reached", "allreduce_s": "seconds per all-reduce (two per layer and step)",
    "overhead_s": "fixed seconds per engine step",
}


def _steps(text: str) -> str:
    """``--steps``: a count >= 1, or 'published'."""
    if text != "published":
        usage.at_least(1)(text)
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("study")
    g.add_argument("--preset", action="append", choices=sorted(PRESETS),
                   help=f"preset to run (repeatable; default: {' '.join(STUDY_PRESETS)})")
    g.add_argument("--steps", type=_steps, default="12", help="paired steps per preset, or 'published' for the PR's counts (default 12)")
    g.add_argument("--seed", type=int, default=0, help="random seed of the workload (default 0)")
    g.add_argument("--jobs", type=usage.at_least(1), default=os.cpu_count() or 1,
                   help="worker processes (default: the CPUs, %(default)s)")
    g.add_argument("--policies", default="", help="comma-separated arm labels to run (sticky always runs); default all")
    g.add_argument("--margins", type=usage.margins, metavar="N,N,...",
                   help="also run our rule at these margins (arms ours_marginN), e.g. 8,16")
    g.add_argument("--list-policies", action="store_true", help="print the arm labels (for --policies) with their names and exit")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    g.add_argument("--markdown", metavar="FILE", type=usage.output_file, help="also write the tables as markdown")
    g.add_argument("--json-out", metavar="FILE", type=usage.output_file, help="also write the JSON to FILE")
    g.add_argument("--plots", metavar="DIR", help="write PNG plots (sim-*.png) to DIR")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--ray-address", metavar="ADDR",
                   help="run on a Ray cluster instead of local processes: host:port, 'auto', or 'local' (a private instance)")
    d = parser.add_argument_group("grid (docs/simulator.md: the margin over KV pool x concurrency x context x routers)")
    d.add_argument("--grid", choices=sorted(GRIDS), help="run a grid instead of presets ('quick': seconds, for tests)")
    d.add_argument("--verl-grid", choices=sorted(VERL_GRIDS), help="run a verl grid (docs/simulator.md: \"The traffic "
                   "verl sends\"): verl's agent loops and balancer over the unpublished quantities")
    d.add_argument("--seeds", type=usage.at_least(1), help="paired steps per grid point (default: the grid's own)")
    d.add_argument("--cache", metavar="FILE", type=usage.output_file, help="keep finished grid steps in FILE (JSON lines): a rerun reuses those "
                   "the same model computed, so an interrupted run resumes")
    d.add_argument("--from-json", metavar="FILE", type=usage.existing_file, help="re-render a saved grid (--json-out) without simulating")
    d.add_argument("--docs", metavar="FILE", type=usage.existing_file, help="rewrite the generated sections of FILE (docs/simulator.md)")
    d.add_argument("--readme", metavar="FILE", type=usage.existing_file, help="rewrite the generated simulator table of FILE (README.md)")
    w = parser.add_argument_group("workload and engine overrides (apply to every chosen preset)")
    w.add_argument("--prompts", type=usage.at_least(1), help="GRPO groups per step")
    w.add_argument("--samples", type=usage.at_least(1), help="samples per prompt (GRPO n)")
    w.add_argument("--replicas", type=usage.at_least(1), help="vLLM replicas in the fleet")
    w.add_argument("--kv-tokens", type=usage.at_least(1), help="KV pool per replica, tokens")
    w.add_argument("--max-num-seqs", type=usage.at_least(1), help="most sequences running in one engine step")
    w.add_argument("--max-batched-tokens", type=usage.at_least(1), help="token budget of one engine step")
    w.add_argument("--tool-latency", type=usage.number(positive=False), help="median tool latency, seconds")
    w.add_argument("--router-lru", type=usage.at_least(1), help="sticky-map size of the affinity arms (verl: 10000)")
    c = parser.add_argument_group("cost model (defaults: Qwen2.5-32B bf16, TP 4, H200)")
    for f in dataclasses.fields(CostModel):
        c.add_argument("--" + f.name.replace("_", "-"), type=usage.at_least(1) if isinstance(f.default, int)
                       else usage.number(positive=not f.name.endswith("_s")), default=f.default, dest="cost_" + f.name,
                       help=f"{COST_HELP[f.name]} (default: %(default)g)")


def _overrides(args) -> dict:
    m = {"prompts": args.prompts, "n": args.samples, "replicas": args.replicas, "kv_tokens": args.kv_tokens,
         "max_num_seqs": args.max_num_seqs, "max_batched_tokens": args.max_batched_tokens,
         "tool_latency": args.tool_latency, "router_lru": args.router_lru}
    return {k: v for k, v in m.items() if v is not None}


def run(args) -> int:
    if args.list_policies and (args.grid or args.verl_grid):
        return _list_grid_arms(args)
    if args.grid or args.verl_grid or args.from_json:
        return run_grid_command(args)
    names = args.preset or STUDY_PRESETS
    presets = tuple(dataclasses.replace(p, **_overrides(args)) for p in resolve_presets(names))
    if args.list_policies:
        from .report import arm_name

        print("\n".join(f"{a.label:<24}{arm_name(a.label)}" for a in arms_for(presets[0], args.margins or ())))
        return 0
    if args.steps == "published":
        steps = {p.name: p.steps for p in presets}
    else:
        steps = {p.name: int(args.steps) for p in presets}
    cost = CostModel(**{f.name: getattr(args, "cost_" + f.name) for f in dataclasses.fields(CostModel)})
    arm_filter = tuple(s for s in args.policies.split(",") if s)
    known = {a.label for a in arms_for(presets[0], args.margins or ())}
    if set(arm_filter) - known:
        unknown = ", ".join(sorted(set(arm_filter) - known))
        raise usage.UsageError(f"--policies {args.policies}: unknown arm label {unknown} (--list-policies shows them)")
    cfg = Config(presets=presets, steps=steps, seed=args.seed, cost=cost, arm_filter=arm_filter,
                 margins=args.margins or ())
    study = run_study(cfg, jobs=max(1, args.jobs), progress=not args.no_progress, ray_address=args.ray_address)
    if args.plots:
        from .plots import write_plots

        for path in write_plots(study, args.plots):
            print(f"wrote {path}", file=sys.stderr)
    for pr in study["presets"].values():
        pr.pop("load_traces", None)
    if args.json_out:
        _write(args.json_out, json.dumps(study, indent=1))
    from .report import markdown

    return _emit(args, study, markdown(study))


def _list_grid_arms(args) -> int:
    """``--list-policies`` with a grid: the arm labels the grid runs, each with the points it runs at, and exit."""
    from . import grid, verlgrid

    spec, planner = (verlgrid.VERL_GRIDS[args.verl_grid], verlgrid.plan) if args.verl_grid else \
        (grid.GRIDS[args.grid], grid.plan)
    counts: dict[str, int] = {}
    for arms in planner(spec["blocks"]).values():
        for arm in arms:
            counts[arm] = counts.get(arm, 0) + 1
    print("\n".join(f"{arm:<28}{count} point{'' if count == 1 else 's'}" for arm, count in counts.items()))
    return 0


def run_grid_command(args) -> int:
    """``--grid NAME``, ``--verl-grid NAME`` or ``--from-json`` (either kind): run or load a grid, then write JSON,
    plots, markdown and docs."""
    from . import gridreport, verlreport

    if args.from_json:
        grid = _saved_grid(args.from_json)
    elif args.verl_grid:
        grid = verlreport.run(args)
    else:
        from .grid import run_grid

        cost = CostModel(**{f.name: getattr(args, "cost_" + f.name) for f in dataclasses.fields(CostModel)})
        grid = run_grid(args.grid, seeds=args.seeds, seed=args.seed, cost=cost, jobs=max(1, args.jobs),
                        ray_address=args.ray_address, progress=not args.no_progress, cache=args.cache)
    verl = verlreport.is_verl(grid)
    if args.json_out:
        _write(args.json_out, json.dumps(grid, indent=1))
    if args.plots:
        from .plots import write_grid_plots
        from .verlplots import write_verl_plots

        for path in (write_verl_plots if verl else write_grid_plots)(grid, args.plots):
            print(f"wrote {path}", file=sys.stderr)
    report = verlreport if verl else gridreport
    for flag, path, sections in (("--docs", args.docs, report.sections(grid)),
                                 ("--readme", args.readme, report.readme_sections(grid))):
        if path:
            try:
                _write(path, gridreport.fill(usage.reading(flag, path), sections))
            except ValueError as error:  # the file lacks a generated section's markers
                raise usage.UsageError(f"{flag} {path}: {error}") from None
    return _emit(args, grid, report.markdown(grid))


def _emit(args, data: dict, md: str) -> int:
    """Write ``--markdown``, then print the JSON (``--json``) or the markdown."""
    if args.markdown:
        _write(args.markdown, md + "\n")
    if args.json:
        json.dump(data, sys.stdout)
        print()
    else:
        print(md)
    return 0


def _saved_grid(path: str) -> dict:
    """A grid written by --json-out; anything else is a ``UsageError`` naming --from-json."""
    try:
        grid = json.loads(usage.reading("--from-json", path))
    except ValueError as error:
        raise usage.UsageError(f"--from-json {path}: not JSON ({error})") from None
    if not isinstance(grid, dict) or not isinstance(grid.get("points"), list):
        raise usage.UsageError(f"--from-json {path}: not a grid written by --json-out (no \"points\" list)")
    return grid


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollout_router.sim", description="Fleet simulator for routing policies")
    add_arguments(parser)
    return run(parser.parse_args(argv))
