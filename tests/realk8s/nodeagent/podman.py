"""Run a container from its image with podman + runc, inside the pod's network namespace.

Used for the images podman has in its local storage (the project's router and operator images, built by
``make image``; nothing can be pulled here, so ``--pull=never``). What the kubelet would do with the pod's
spec, podman is told:
- the pod's network namespace (``--network ns:/run/netns/<pod>``), its hostname, and the /etc/hosts the
  agent writes (``--no-hosts`` + a bind mount);
- ``command``/``args`` replace the image's ENTRYPOINT/CMD as Kubernetes defines it (command alone drops CMD);
- the securityContext: ``runAsUser``/``runAsGroup`` (``--user``), ``runAsNonRoot`` (refused when the user
  would be root), ``readOnlyRootFilesystem`` (``--read-only``, without podman's extra tmpfs mounts, which a
  kubelet does not add), ``allowPrivilegeEscalation: false`` (``no-new-privileges``), ``capabilities``;
  the default seccomp profile is the runtime's (``RuntimeDefault``);
- volumes as bind mounts of the directories the agent projects (so ConfigMap updates, swapped atomically,
  reach the running container), read-only where the mount says so;
- env: the container's, by name only on the command line (values pass through podman's own environment,
  not its argv).
Not applied: resource limits (no cgroup controller is delegated here) and image pulls.
A container is stopped with ``podman stop`` (SIGTERM, the grace period, SIGKILL), not by signalling the
``podman run`` client, whose container would outlive it.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ..runtime import AGENT_LABEL, PODMAN, podman_env

RESERVED_ENV = {"PATH", "CONTAINERS_CONF"}  # podman's own: passed as values, never inherited by name


class RefusedContainer(ValueError):
    """The pod's spec cannot be honoured (e.g. runAsNonRoot with a root user)."""


class PodmanRun(subprocess.Popen):
    """The ``podman run`` client of one container; ``name`` is the container's name."""

    name: str
    image_id: str


def image_exists(image: str) -> bool:
    return subprocess.run([*PODMAN, "image", "exists", image], env=podman_env(), capture_output=True).returncode == 0


def image_config(image: str) -> dict:
    """The image's id and config (User, Entrypoint, Cmd, Env)."""
    answer = subprocess.run([*PODMAN, "image", "inspect", image], env=podman_env(), capture_output=True, text=True,
                            check=True)
    found = json.loads(answer.stdout)[0]
    return {"Id": found["Id"], **(found.get("Config") or {})}


def user_flags(pod: dict, container: dict, image_user: str) -> list[str]:
    """``--user`` from runAsUser/runAsGroup (container over pod), checked against runAsNonRoot."""
    pod_ctx, ctx = pod["spec"].get("securityContext") or {}, container.get("securityContext") or {}
    uid = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
    gid = ctx.get("runAsGroup", pod_ctx.get("runAsGroup"))
    effective = str(uid) if uid is not None else (image_user.split(":")[0] or "0")
    if ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) and effective in ("0", "root"):
        raise RefusedContainer(f"container {container['name']}: runAsNonRoot, but it would run as root")
    if uid is None:
        return []
    return ["--user", f"{uid}:{gid}" if gid is not None else str(uid)]


def security_flags(container: dict) -> list[str]:
    ctx = container.get("securityContext") or {}
    flags = ["--read-only", "--read-only-tmpfs=false"] if ctx.get("readOnlyRootFilesystem") else []
    if ctx.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    if ctx.get("privileged"):
        flags.append("--privileged")
    capabilities = ctx.get("capabilities") or {}
    flags += [f"--cap-drop={cap}" for cap in capabilities.get("drop") or []]
    flags += [f"--cap-add={cap}" for cap in capabilities.get("add") or []]
    return flags


def command_flags(container: dict, expanded_command: list[str], expanded_args: list[str]) -> tuple[list[str], list[str]]:
    """(flags before the image, arguments after it): Kubernetes' command/args over ENTRYPOINT/CMD."""
    if not container.get("command"):
        return [], expanded_args  # the image's ENTRYPOINT; args (if any) replace CMD
    return ["--entrypoint", json.dumps(expanded_command)], expanded_args  # podman drops CMD with --entrypoint


def start(pod: dict, container: dict, netns: str, mounts: list[tuple[Path, str, bool]], env: dict[str, str],
          command: list[str], args: list[str], restarts: int, log: object) -> PodmanRun:
    """``podman run`` the container (attached: its output goes to ``log``); returns the client process."""
    meta = pod["metadata"]
    config = image_config(container["image"])
    name = f"rrk8s-{meta['uid'][:13]}-{container['name']}-{restarts}"
    flags = ["--rm", "--name", name, "--pull=never", "--label", f"{AGENT_LABEL}=1",
             "--label", f"io.kubernetes.pod.uid={meta['uid']}", "--network", f"ns:/run/netns/{netns}",
             "--hostname", meta["name"], "--no-hosts", "--log-driver", "none", "--stop-signal", "SIGTERM"]
    flags += user_flags(pod, container, config.get("User") or "")
    flags += security_flags(container)
    for source, target, read_only in mounts:
        flags += ["--volume", f"{source}:{target}:{'ro' if read_only else 'rw'}"]
    if container.get("workingDir"):
        flags += ["--workdir", container["workingDir"]]
    client_env = {**env, **podman_env()}
    for key, value in env.items():
        flags += ["--env", f"{key}={value}" if key in RESERVED_ENV else key]
    entrypoint, after = command_flags(container, command, args)
    process = PodmanRun([*PODMAN, "run", *flags, *entrypoint, container["image"], *after], env=client_env,
                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    process.name, process.image_id = name, config["Id"]
    return process


def stop(process: PodmanRun, grace_seconds: float) -> None:
    """``podman stop``: SIGTERM to the container, SIGKILL after the grace period; then the client exits."""
    subprocess.run([*PODMAN, "stop", "--time", str(max(int(grace_seconds), 0)), process.name], env=podman_env(),
                   capture_output=True)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:  # the container is gone; a stuck client is all that is left
        process.kill()
        process.wait()


def main_pid(name: str) -> int:
    """The host pid of the container's first process (for tests that inspect it)."""
    answer = subprocess.run([*PODMAN, "inspect", "--format", "{{.State.Pid}}", name], env=podman_env(),
                            capture_output=True, text=True, check=True)
    return int(answer.stdout.strip())

