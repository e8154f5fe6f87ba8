"""``rollout-router crd``: print the RolloutRouter CRD, generated from the models."""
from __future__ import annotations

import argparse
import sys

from rollout_router.usage import UsageError

from .crd import crd_yaml


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", "-o", metavar="FILE", help="Write to FILE instead of stdout (default: stdout).")


def run(args: argparse.Namespace) -> int:
    text = crd_yaml()
    if args.output:
        try:
            with open(args.output, "w") as out:
                out.write(text)
        except OSError as error:
            raise UsageError(f"--output {args.output}: {error.strerror}") from None
    else:
        sys.stdout.write(text)
    return 0
