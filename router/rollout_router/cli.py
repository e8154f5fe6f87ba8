"""The ``rollout-router`` command: one entry point, one subcommand per job.

Each subcommand's module is imported only when it runs, so ``serve`` never
pays for matplotlib and ``fake-vllm`` never loads kopf. The core install runs
``serve``, ``fake-vllm``, ``crd`` and ``render``; the others need an extra (pyproject.toml),
and a missing one is reported in one line before anything is imported.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import sys
from typing import NamedTuple, NoReturn

from .usage import UsageError


class Subcommand(NamedTuple):
    module: str  # has add_arguments(parser) and run(args)
    extra: str | None  # the pyproject.toml extra its imports need; None: the core install
    summary: str
    flags_need_extra: bool = True  # False: add_arguments imports nothing of the extra, so --help works without it


SUBCOMMANDS = {
    "serve": Subcommand("rollout_router.serve", None, "Run the router in front of vLLM replicas."),
    "fake-vllm": Subcommand("rollout_router.fakevllm", None, "Run a simulated vLLM replica (OpenAI-compatible)."),
    "demo": Subcommand("rollout_router.demo", "sim",
                       "Compare routing policies on a simulated fleet on this machine."),
    "simulate": Subcommand("rollout_router.sim", "sim",
                           "Discrete-event fleet simulator: compare policies on RL rollout steps."),
    "operator": Subcommand("rollout_router_operator.cli", "operator",
                           "Run the Kubernetes operator for RolloutRouter resources.", flags_need_extra=False),
    "crd": Subcommand("rollout_router_operator.cli_crd", None, "Print the RolloutRouter CustomResourceDefinition YAML."),
    "render": Subcommand("rollout_router_operator.cli_render", "operator",  # the CRD's CEL rules: celpy
                         "Print the objects the operator would create for the RolloutRouters in a file, offline."),
}

# extra -> the top-level modules it installs (the same packages as pyproject.toml's optional-dependencies;
# tests/test_packaging.py keeps the two equal).
EXTRAS = {
    "operator": ("kopf", "kubernetes", "celpy"),
    "kubeconfig": ("kubernetes",),
    "sim": ("numpy", "matplotlib", "tqdm"),
}


def require_extra(command: str) -> None:
    """Stop with one line naming the extra to install, instead of an ImportError traceback mid-import.

    ``find_spec`` only locates a top-level module, so checking costs no import.
    """
    extra = SUBCOMMANDS[command].extra
    missing = [name for name in EXTRAS.get(extra or "", ()) if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"needs the [{extra}] extra ({', '.join(missing)} not installed): "
                         f"pip install 'rollout-router[{extra}]' (from a checkout: pip install -e '.[{extra}]')")


class Parser(argparse.ArgumentParser):
    """argparse, whose mistakes are one line (the flag as written, what is wrong, where the help is) and exit 2,
    without the usage block above it; subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def version() -> str:
    try:
        return importlib.metadata.version("rollout-router")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = Parser(prog="rollout-router", description=(
        "RolloutRouter: a session-affinity router for vLLM fleets, with its operator, simulator and demo."))
    parser.add_argument("--version", action="version", version=f"rollout-router {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = _chosen(argv)
    for name, command in SUBCOMMANDS.items():
        summary = command.summary + (f" Needs the [{command.extra}] extra." if command.extra else "")
        subparser = sub.add_parser(name, help=summary, description=summary)
        subparser.set_defaults(module=command.module)
        if name == chosen:  # only the chosen one is imported to add its flags
            if command.flags_need_extra:
                require_extra(name)
            importlib.import_module(command.module).add_arguments(subparser)
    return parser


def _chosen(argv: list[str]) -> str | None:
    """The subcommand named on the command line (the first word that is not a flag)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    """Parse, run; a ``UsageError`` from anywhere in the run is one line and exit 2, Ctrl-C ends quietly (130)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(argv).parse_args(argv)
        require_extra(args.command)
        args.argv = argv  # serve --workers N repeats it for its workers
        return importlib.import_module(args.module).run(args) or 0
    except UsageError as error:
        print(f"rollout-router {_chosen(argv)}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
