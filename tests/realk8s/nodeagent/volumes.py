"""Pod volumes as the kubelet lays them out: configMap, secret, projected, downwardAPI, emptyDir.

configMap, secret, projected and downwardAPI volumes are written with the kubelet's atomic writer:
the files live in a timestamped directory ``..2026_01_01_00_00_00.123``, ``..data`` is a symlink to
it and every visible name is a symlink through ``..data``. An update writes a new timestamped
directory, points ``..data_tmp`` at it and renames that over ``..data`` (one atomic rename), then
removes the old directory: a reader sees the old files or the new ones, never a mix. That is what
lets a process watching a mounted ConfigMap (the router's --config) reload it safely.
"""
from __future__ import annotations

import base64
import datetime
import os
import shutil
from pathlib import Path
from typing import Any

from kubernetes import client

from .fields import field_value

DEFAULT_MODE = 0o644


class TokenSource:
    """ServiceAccount tokens from the TokenRequest API, bound to the pod, cached per audience."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.cache: dict[tuple[str, str, int], str] = {}

    def token(self, pod: dict, audience: str, expiration: int) -> str:
        key = (pod["metadata"]["uid"], audience, expiration)
        if key not in self.cache:
            meta = pod["metadata"]
            body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
                "audiences": [audience] if audience else None, "expirationSeconds": expiration,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}}}
            answer = self.core.create_namespaced_service_account_token(
                pod["spec"].get("serviceAccountName") or "default", meta["namespace"], body)
            self.cache[key] = answer.status.token
        return self.cache[key]

    def forget(self, pod_uid: str) -> None:
        self.cache = {k: v for k, v in self.cache.items() if k[0] != pod_uid}


def _items(data: dict[str, bytes], items: list[dict] | None, default_mode: int) -> dict[str, tuple[bytes, int]]:
    """Which keys become which files: all keys, or just the listed ``items`` under their paths."""
    if not items:
        return {key: (value, default_mode) for key, value in data.items()}
    return {item["path"]: (data[item["key"]], item.get("mode") or default_mode) for item in items if item["key"] in data}


def _configmap(core: client.CoreV1Api, namespace: str, source: dict) -> dict[str, bytes]:
    cm = core.read_namespaced_config_map(source["name"], namespace)
    data = {k: v.encode() for k, v in (cm.data or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (cm.binary_data or {}).items()})
    return data


def _secret(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (core.read_namespaced_secret(name, namespace).data or {}).items()}


def _downward(pod: dict, items: list[dict], default_mode: int) -> dict[str, tuple[bytes, int]]:
    return {item["path"]: (field_value(pod, item["fieldRef"]["fieldPath"]).encode(), item.get("mode") or default_mode)
            for item in items if "fieldRef" in item}


def volume_files(core: client.CoreV1Api, tokens: TokenSource, pod: dict, volume: dict) -> dict[str, tuple[bytes, int]]:
    """The files (path -> content, mode) a configMap/secret/projected/downwardAPI volume holds now."""
    namespace = pod["metadata"]["namespace"]
    if "configMap" in volume:
        source = volume["configMap"]
        return _items(_configmap(core, namespace, source), source.get("items"), source.get("defaultMode") or DEFAULT_MODE)
    if "secret" in volume:
        source = volume["secret"]
        data = _secret(core, namespace, source["secretName"])
        return _items(data, source.get("items"), source.get("defaultMode") or DEFAULT_MODE)
    if "downwardAPI" in volume:
        source = volume["downwardAPI"]
        return _downward(pod, source.get("items") or [], source.get("defaultMode") or DEFAULT_MODE)
    source = volume["projected"]
    mode = source.get("defaultMode") or DEFAULT_MODE
    files: dict[str, tuple[bytes, int]] = {}
    for part in source.get("sources") or []:
        if "serviceAccountToken" in part:
            sat = part["serviceAccountToken"]
            token = tokens.token(pod, sat.get("audience") or "", sat.get("expirationSeconds") or 3600)
            files[sat["path"]] = (token.encode(), mode)
        elif "configMap" in part:
            files.update(_items(_configmap(core, namespace, part["configMap"]), part["configMap"].get("items"), mode))
        elif "secret" in part:
            files.update(_items(_secret(core, namespace, part["secret"]["name"]), part["secret"].get("items"), mode))
        elif "downwardAPI" in part:
            files.update(_downward(pod, part["downwardAPI"].get("items") or [], mode))
    return files


def _current(directory: Path) -> dict[str, tuple[bytes, int]]:
    data = directory / "..data"
    if not data.exists():
        return {}
    return {str(p.relative_to(data.resolve())): (p.read_bytes(), p.stat().st_mode & 0o777)
            for p in data.resolve().rglob("*") if p.is_file()}


def write_atomically(directory: Path, files: dict[str, tuple[bytes, int]]) -> bool:
    """Lay ``files`` out under ``directory`` the kubelet's way; False when nothing changed."""
    directory.mkdir(parents=True, exist_ok=True)
    if _current(directory) == files:
        return False
    stamp = datetime.datetime.now(datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    new = directory / stamp
    for path, (content, mode) in files.items():
        target = new / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(mode)
    new.chmod(0o755)
    data, tmp = directory / "..data", directory / "..data_tmp"
    old = data.resolve() if data.is_symlink() else None
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(stamp)
    os.rename(tmp, data)  # the atomic step
    for top in {path.split("/")[0] for path in files}:
        link = directory / top
        if not link.is_symlink():
            link.symlink_to(f"..data/{top}")
    for entry in directory.iterdir():  # names that disappeared from the volume
        if entry.is_symlink() and not entry.name.startswith("..") and not entry.exists():
            entry.unlink()
    if old is not None and old != new:
        shutil.rmtree(old, ignore_errors=True)
    return True


def prepare(core: client.CoreV1Api, tokens: TokenSource, pod: dict, root: Path) -> dict[str, Path]:
    """Create every volume of ``pod`` under ``root``; returns volume name -> host directory."""
    paths = {}
    for volume in pod["spec"].get("volumes") or []:
        path = root / volume["name"]
        if "emptyDir" in volume:
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)
        elif any(kind in volume for kind in ("configMap", "secret", "projected", "downwardAPI")):
            write_atomically(path, volume_files(core, tokens, pod, volume))
        else:
            raise ValueError(f"volume {volume['name']}: only emptyDir, configMap, secret, projected, downwardAPI")
        paths[volume["name"]] = path
    return paths


def refresh(core: client.CoreV1Api, tokens: TokenSource, pod: dict, paths: dict[str, Path]) -> list[str]:
    """Re-read the sources of the file volumes and swap in what changed; returns the changed names."""
    changed = []
    for volume in pod["spec"].get("volumes") or []:
        if "emptyDir" in volume or volume["name"] not in paths:
            continue
        try:
            files = volume_files(core, tokens, pod, volume)
        except client.ApiException:
            continue  # a source that vanished keeps the last files, as the kubelet does
        if write_atomically(paths[volume["name"]], files):
            changed.append(volume["name"])
    return changed


def status_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def as_dict(api_object: Any) -> dict:
    """A kubernetes-client model as the plain JSON dict the API sent."""
    return client.ApiClient().sanitize_for_serialization(api_object)
