"""``rollout-router render FILE``: the objects the operator would create for each RolloutRouter in FILE, offline.

The operator's own ``render`` (pure: no cluster, no clock) does the work, so what this prints is what the
operator applies. Two values exist only in a cluster: the owner's uid (the API server assigns it) and the
routers' admin token (derived from the operator's key). A resource read back from the cluster
(``kubectl get rr NAME -o yaml``) carries its uid, and ``--admin-token-key-file`` takes the operator's key;
without them both are placeholders, said in the output's leading comment.
"""
from __future__ import annotations

import argparse
import base64
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from rollout_router.usage import UsageError

from .cli import IMAGE_ENV, token_key
from .render import TOKEN_FILE, InvalidSpec, render, token_secret_name
from .spec import DEFAULT_IMAGE, GROUP, KIND, VERSION

API_VERSION = f"{GROUP}/{VERSION}"
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
PLACEHOLDER_TOKEN = "placeholder: the operator derives each resource's token from its key"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="A YAML file of RolloutRouters (several documents, or a "
                                                     "List as kubectl prints it); '-' reads stdin.")
    parser.add_argument("--namespace", "-n", metavar="NS", default=None,
                        help="The namespace of resources that name none (default: default, as kubectl's).")
    parser.add_argument("--router-image", default=os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE, metavar="IMAGE",
                        help=f"The operator's --router-image: routers whose spec.router.image is unset run it "
                             f"(default: ${IMAGE_ENV}, else {DEFAULT_IMAGE}).")
    parser.add_argument("--admin-token-key-file", type=Path, metavar="PATH", default=None,
                        help="The operator's key (its --admin-token-key-file), for the routers' real admin token; "
                             "without it the token Secret holds a placeholder.")


def run(args: argparse.Namespace) -> int:
    source = "stdin" if args.file == "-" else args.file
    key = _key(args.admin_token_key_file)
    out = []
    for resource in resources(_read(args.file), source):
        resource = _placed(resource, args.namespace, source)
        try:  # the operator always has a key, so there is always a token Secret (its value replaced without one)
            children = render(resource, args.router_image, token_key=key or b"offline")
        except InvalidSpec as error:
            raise UsageError(f"{source}: RolloutRouter {resource['metadata']['name']}: {error}") from None
        out.append(_header(resource, bool(key)) + dump(children if key else _without_token(resource, children)))
    sys.stdout.write("".join(out))
    return 0


def _read(file: str) -> str:
    try:
        return sys.stdin.read() if file == "-" else Path(file).read_text()
    except OSError as error:
        raise UsageError(f"{file}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{file}: not a text file") from None


def _key(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return token_key(path)
    except OSError as error:
        raise UsageError(f"--admin-token-key-file {path}: {error.strerror}") from None
    except ValueError as error:
        raise UsageError(f"--admin-token-key-file {path}: {error}") from None


def resources(text: str, source: str) -> list[dict]:
    """Every RolloutRouter of ``text`` (a List's items too); anything else is a mistake named by its document."""
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.MarkedYAMLError as error:
        where = f"line {error.problem_mark.line + 1}, column {error.problem_mark.column + 1}: " \
            if error.problem_mark else ""
        raise UsageError(f"{source}: not YAML: {where}{error.problem}") from None
    except yaml.YAMLError as error:
        raise UsageError(f"{source}: not YAML: {str(error).splitlines()[0]}") from None
    found = []
    for index, document in enumerate(documents, 1):
        listed = isinstance(document, dict) and document.get("kind") == "List"
        for item in (document.get("items") or []) if listed else [document]:
            if not (isinstance(item, dict) and item.get("kind") == KIND and item.get("apiVersion") == API_VERSION):
                raise UsageError(f"{source}: document {index} is {_what(item)}, not a {KIND} ({API_VERSION})")
            found.append(item)
    if not found:
        raise UsageError(f"{source}: no {KIND} in it")
    return found


def _what(item: Any) -> str:
    if isinstance(item, dict):
        return f"a {item.get('kind') or 'mapping without kind'} ({item.get('apiVersion') or 'no apiVersion'})"
    return f"a {type(item).__name__}"


def _placed(resource: dict, namespace: str | None, source: str) -> dict:
    """The resource with a namespace and a uid, as the operator receives it; kubectl's rule for ``-n``."""
    meta = resource.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise UsageError(f"{source}: a {KIND} without metadata.name")
    if namespace and meta.get("namespace") and meta["namespace"] != namespace:
        raise UsageError(f"{source}: {KIND} {meta['name']} is in namespace {meta['namespace']}, "
                         f"not --namespace {namespace}")
    placed = {"namespace": meta.get("namespace") or namespace or "default", "uid": meta.get("uid") or PLACEHOLDER_UID}
    return {**resource, "metadata": {**meta, **placed}}


def _without_token(resource: dict, children: list[dict]) -> list[dict]:
    """The token Secret's value replaced by a placeholder: without the operator's key it could only be wrong."""
    secret = token_secret_name(resource["metadata"]["name"])
    placeholder = base64.b64encode(PLACEHOLDER_TOKEN.encode()).decode()
    return [{**child, "data": {TOKEN_FILE: placeholder}} if child["kind"] == "Secret" and
            child["metadata"]["name"] == secret else child for child in children]


def _header(resource: dict, keyed: bool) -> str:
    meta = resource["metadata"]
    lines = [f"# {KIND} {meta['namespace']}/{meta['name']}: what the operator creates (rollout-router render)"]
    if meta["uid"] == PLACEHOLDER_UID:
        lines.append("# ownerReferences[0].uid: a placeholder (the API server assigns the resource's uid)")
    if not keyed:
        lines.append("# the admin token Secret: a placeholder (--admin-token-key-file gives the operator's key)")
    return "".join(line + "\n" for line in lines)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the router's config file in its ConfigMap) as literal blocks, readable as written."""


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _str)


def dump(objects: list[dict]) -> str:
    """Multi-document YAML, each object after its own ``---``, in the order the operator applies them."""
    return yaml.dump_all(objects, Dumper=_Dumper, explicit_start=True, sort_keys=False)
