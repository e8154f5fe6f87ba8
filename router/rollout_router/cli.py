"""The ``rollout-router`` command: one entry point, one subcommand per job.

Each subcommand's module is imported only when it runs, so ``serve`` never
pays for matplotlib and ``fake-vllm`` never loads kopf.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module with add_arguments(parser) and run(args), help)
SUBCOMMANDS = {
    "serve": ("rollout_router.serve", "Run the router in front of vLLM replicas."),
    "fake-vllm": ("rollout_router.fakevllm", "Run a simulated vLLM replica (OpenAI-compatible)."),
    "demo": ("rollout_router.demo", "Compare routing policies on a simulated fleet on this machine."),
    "simulate": ("rollout_router.sim", "Discrete-event fleet simulator: compare policies on RL rollout steps."),
    "operator": ("rollout_router_operator.cli", "Run the Kubernetes operator for RolloutRouter resources."),
    "crd": ("rollout_router_operator.cli_crd", "Print the RolloutRouter CustomResourceDefinition YAML."),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollout-router", description=(
        "RolloutRouter: a session-affinity router for vLLM fleets, with its operator, simulator and demo."))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, (module, summary) in SUBCOMMANDS.items():
        command = sub.add_parser(name, help=summary, description=summary)
        command.set_defaults(module=module)
        if name == chosen:  # only the chosen one is imported to add its flags
            importlib.import_module(module).add_arguments(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    return importlib.import_module(args.module).run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
