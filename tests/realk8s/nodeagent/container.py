"""Run one container inside its pod's network namespace: from its image, or as a local process.

With podman (the agent's ``--runtime podman``), the project's two images run from the images
``make image`` built (podman.py). Every other image, and the project's images under ``--runtime
processes``, is mapped to a program installed on this machine:
- an image whose repository ends in ``rollout-router`` runs the installed ``rollout-router`` with
  the container's ``command``/``args`` (the image's entrypoint is ``rollout-router``, its default
  command ``serve --host 0.0.0.0 --port 8080``);
- an image whose repository names vLLM (``vllm/vllm-openai``, ``…/vllm…``) runs
  ``rollout-router fake-vllm --host 0.0.0.0 --port <the container's first port>``, passing on
  ``--served-model-name`` from the args (the other args are vLLM's own and are not passed on).
Anything else fails the container (reason ``UnsupportedImage``).

The process starts with ``ip netns exec`` (its own network namespace and, as ``ip netns exec``
always makes one, its own mount namespace). A small shell prologue then bind-mounts every
volumeMount at its mountPath (the ServiceAccount token lands at
/var/run/secrets/kubernetes.io/serviceaccount as in a pod), remounts ``/`` read-only when the
container asks for ``readOnlyRootFilesystem``, and ``exec``s the program as ``runAsUser`` when
that user can run this machine's Python (else as root: see ``Launcher.run_as``).
"""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from . import podman
from .fields import expand

ROUTER_DEFAULT_ARGS = ["serve", "--host", "0.0.0.0", "--port", "8080"]
CHECKOUT = Path(__file__).resolve().parents[3]  # the repository: the editable install's source roots live here
HIDDEN_FD = 10  # fds 3-9 hold the volumes' sources; bash (not sh) opens two-digit fds


class UnsupportedImage(ValueError):
    pass


def image_repository(image: str) -> str:
    name = image.split("@")[0]
    last = name.rsplit("/", 1)[-1]
    return name.rsplit(":", 1)[0] if ":" in last else name


def is_project_image(image: str) -> bool:
    return image_repository(image).rsplit("/", 1)[-1] in ("rollout-router", "rollout-router-operator")


def command_and_args(container: dict, env: dict[str, str]) -> tuple[list[str], list[str]]:
    """The container's command and args with ``$(VAR)`` references expanded."""
    return ([expand(part, env) for part in container.get("command") or []],
            [expand(part, env) for part in container.get("args") or []])


def program(container: dict, bin_dir: Path, env: dict[str, str]) -> list[str]:
    """The argv the image stands for on this machine (see the module docstring)."""
    repository = image_repository(container["image"])
    command, args = command_and_args(container, env)
    router = str(bin_dir / "rollout-router")
    if is_project_image(container["image"]):
        if not command:
            return [router, *(args or ROUTER_DEFAULT_ARGS)]
        head = router if command[0] in ("rollout-router", "/opt/rollout-router/bin/rollout-router") else command[0]
        return [head, *command[1:], *args]
    if "vllm" in repository.rsplit("/", 1)[-1] or "vllm" in repository.split("/")[0]:
        ports = container.get("ports") or [{"containerPort": 8000}]
        name = args[args.index("--served-model-name") + 1:][:1] if "--served-model-name" in args else []
        return [router, "fake-vllm", "--host", "0.0.0.0", "--port", str(ports[0]["containerPort"]),
                *(["--served-model-name", *name] if name else [])]
    raise UnsupportedImage(f"image {container['image']!r}: the node agent runs only rollout-router and vLLM images")


@dataclass
class Launcher:
    """Starts containers; ``allowed_uids`` are the users that can run the installed Python (processes)."""

    bin_dir: Path
    log_dir: Path
    allowed_uids: frozenset[int]
    image_files: list[tuple[Path, str, bool]] = field(default_factory=list)  # files the image has, bound over the host's
    made_dirs: list[Path] = field(default_factory=list)
    use_podman: bool = False  # run the project's images with podman (runtime.py decides)

    def from_image(self, container: dict) -> bool:
        """Whether this container runs from its image (podman) rather than as a process."""
        return self.use_podman and is_project_image(container["image"])

    def base_env(self, container: dict, process_env: dict[str, str]) -> dict[str, str]:
        """The environment before the container's ``env``: the image's own under podman (plus the service
        variables and HOSTNAME, as the kubelet adds them), else this machine's for the installed program."""
        if not self.from_image(container):
            return process_env
        if not podman.image_exists(container["image"]):
            return {}  # start() says why it cannot run
        image_env = dict(item.split("=", 1) for item in podman.image_config(container["image"]).get("Env") or [])
        return {**image_env, **{k: v for k, v in process_env.items() if k.startswith("KUBERNETES_") or k == "HOSTNAME"}}

    def run_as(self, pod: dict, container: dict) -> int:
        """The effective uid: the pod's/container's runAsUser if that user can run Python here, else 0."""
        pod_ctx = pod["spec"].get("securityContext") or {}
        ctx = container.get("securityContext") or {}
        uid = ctx.get("runAsUser", pod_ctx.get("runAsUser", 0))
        return uid if uid in self.allowed_uids else 0

    def _mountpoint(self, target: Path) -> None:
        """Mount points must exist on the shared root filesystem; remember the ones made, to remove them."""
        missing = target
        while not missing.parent.exists():
            missing = missing.parent
        if not target.exists():
            target.mkdir(parents=True)
            self.made_dirs.append(missing)

    def remove_mountpoints(self) -> None:
        """Remove the (empty) directories made for mount points, at shutdown."""
        for top in reversed(self.made_dirs):
            for directory in sorted((p for p in [top, *top.rglob("*")] if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    directory.rmdir()

    def start(self, pod: dict, container: dict, netns: str, mounts: list[tuple[Path, str, bool]],
              env: dict[str, str], restarts: int = 0) -> subprocess.Popen:
        """``mounts``: (host directory, mountPath, readOnly); ``restarts``: how many times it ran before."""
        if self.from_image(container):
            return self._start_podman(pod, container, netns, mounts, env, restarts)
        argv = program(container, self.bin_dir, env)
        mounts = [*self.image_files, *mounts]
        uid = self.run_as(pod, container)
        gid = ((pod["spec"].get("securityContext") or {}).get("runAsGroup", uid)) if uid else 0
        ctx = container.get("securityContext") or {}
        if len(mounts) > 7:  # fds 3-9, two of them for the identity files
            raise UnsupportedImage(f"container {container['name']}: the node agent mounts at most 5 volumes")
        # Every source is opened before the first mount, and bound by its fd (not its path: mount would resolve
        # that again), so a mount at /tmp cannot hide a source under /tmp. So are
        # the program's own files (the virtualenv, the checkout) when a mount would hide them (CI's clone in /tmp).
        hidden = self._hidden_program_dirs(mounts)
        script = [f"exec {3 + i}<{shlex.quote(str(host_dir))}" for i, (host_dir, _, _) in enumerate(mounts)]
        script += [f"exec {HIDDEN_FD + i}<{shlex.quote(str(path))}" for i, path in enumerate(hidden)]
        for i, (source, target, read_only) in enumerate(mounts):
            if source.is_dir():
                self._mountpoint(Path(target))
            script.append(f"mount --no-canonicalize --bind /proc/self/fd/{3 + i} {shlex.quote(target)}")
            if read_only:
                script.append(f"mount -o remount,bind,ro {shlex.quote(target)}")
        for i, path in enumerate(hidden):  # bound back where the volume hid them
            quoted = shlex.quote(str(path))
            script += [f"mkdir -p {quoted}", f"mount --no-canonicalize --bind /proc/self/fd/{HIDDEN_FD + i} {quoted}"]
        if ctx.get("readOnlyRootFilesystem"):
            script.append("mount -o remount,bind,ro /")
        workdir = container.get("workingDir") or "/tmp"
        script.append(f"cd {shlex.quote(workdir)}")
        drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"] if uid else []
        if ctx.get("allowPrivilegeEscalation") is False:
            drop = [*(drop or ["setpriv"]), "--no-new-privs"]
        drop += ["--"] if drop else []
        script += [f"exec {3 + i}<&-" for i in range(len(mounts))]
        script += [f"exec {HIDDEN_FD + i}<&-" for i in range(len(hidden))]
        script.append("exec " + shlex.join(drop + argv))
        return subprocess.Popen(["ip", "netns", "exec", netns, "bash", "-ec", " && ".join(script)], env=env,
                                stdout=self._log(pod, container), stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True)


    def _start_podman(self, pod: dict, container: dict, netns: str, mounts: list[tuple[Path, str, bool]],
                      env: dict[str, str], restarts: int) -> podman.PodmanRun:
        if not podman.image_exists(container["image"]):  # what the kubelet calls ErrImageNeverPull
            raise UnsupportedImage(f"image {container['image']!r} is not in podman's storage (make image builds it)")
        command, args = command_and_args(container, env)
        try:
            return podman.start(pod, container, netns, mounts, env, command, args, restarts, self._log(pod, container))
        except podman.RefusedContainer as refused:
            raise UnsupportedImage(str(refused)) from refused

    def _log(self, pod: dict, container: dict):
        meta = pod["metadata"]
        return open(self.log_dir / f"{meta['namespace']}_{meta['name']}_{container['name']}.log", "ab")

    def _hidden_program_dirs(self, mounts: list[tuple[Path, str, bool]]) -> list[Path]:
        """The virtualenv and the checkout (the editable install's sources) that a mount target would hide."""
        program = {self.bin_dir.resolve().parent, CHECKOUT}
        targets = [Path(target) for _, target, _ in mounts]
        return sorted(p for p in program if any(p == t or t in p.parents for t in targets))


def stop(process: subprocess.Popen, grace_seconds: float) -> None:
    """SIGTERM, up to ``grace_seconds`` to exit, then SIGKILL (the kubelet's order)."""
    if process.poll() is not None:
        return
    if isinstance(process, podman.PodmanRun):
        podman.stop(process, grace_seconds)
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=max(grace_seconds, 0.1))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def image_identity_files(directory: Path) -> list[tuple[Path, str, bool]]:
    """/etc/passwd and /etc/group with the image's ``nonroot`` user (65532) added, as the Dockerfile does.

    Python's ``getpass.getuser()`` (kopf uses it) needs the running uid in /etc/passwd, as in the image.
    """
    files = []
    for name, entry in (("passwd", "nonroot:x:65532:65532::/nonexistent:/usr/sbin/nologin"), ("group", "nonroot:x:65532:")):
        host = Path("/etc") / name
        lines = host.read_text().splitlines()
        if not any(line.split(":")[2:3] == ["65532"] for line in lines):
            lines.append(entry)
        target = directory / name
        target.write_text("\n".join(lines) + "\n")
        target.chmod(0o644)
        files.append((target, str(host), True))
    return files


def usable_uids(candidates: set[int], python: Path) -> frozenset[int]:
    """The uids that can start ``python`` here (a Python under a 0700 home is out of their reach)."""
    usable = {0}
    for uid in candidates - {0}:
        probe = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                                str(python), "-c", "import rollout_router"], capture_output=True)
        if probe.returncode == 0:
            usable.add(uid)
    return frozenset(usable)
