"""``spotgpu bench runtime --cri``: what spotgpu-runtime adds to a kubelet's CreateContainer +
StartContainer, through the real CRI (root).

Side effects: a private containerd with CRI (:class:`spotgpu.testing.cri_rig.CriRig`:
the shipped snippets, the kubelet doubles, the stand-in GPU, spotgpu-runtime's service or NRI
plugin in this process as the agent hosts it), pods and containers created and removed through
the kubelet CRI double; everything removed at the end.

Variants, each one container created and started in a pod that already runs (the kubelet's
``CreateContainer`` then ``StartContainer``, timed together; stop and removal untimed):

* ``plain``: plain runc, the same containerd (``wrapper`` mode: its ``runc`` handler; ``nri``
  mode: the default handler while our plugin is disconnected, so NRI calls no plugin);
* ``passthrough``: a container spotgpu leaves alone (``wrapper``: through the ``spotgpu``
  handler's shell fast path; ``nri``: the NRI plugin's answer, an empty adjustment);
* ``sync``: a spot container whose twin the kubelet granted: the device sync (pod-resources,
  the owner record, the vendor plugin's Allocate, ``stat``) and its adjustment or modified spec.

Rounds run every variant once, in rotating order; each added figure is the median of the
per-round differences against ``plain`` of the same round, so slow drift cancels. The output
carries the environment block of :func:`spotgpu.bench.env.environment` (cores, load average
before and after, kernel, runc and containerd versions, the background load, the git revision);
``--background-load N`` runs N busy loops while the rounds run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from spotgpu.bench import env
from spotgpu.bench.runtime import iqr_ms, median_ms
from spotgpu.core.ids import SPOT_GPU_RESOURCE
from spotgpu.core.refs import ContainerRef
from spotgpu.testing.cri import ContainerSpec, KubeletCri, PodSpec, RunningPod
from spotgpu.testing.cri_containerd import binaries
from spotgpu.testing.cri_rig import CriRig, Mode
from spotgpu.testing.images import busybox_image, pause_image

TARGETS: Final[dict[str, dict[str, float]]] = {
    "wrapper": {"passthrough_added_ms": 5.0, "sync_added_ms": 25.0},
    "nri": {"passthrough_added_ms": 3.0, "sync_added_ms": 15.0},
}
OWNER: Final = ContainerRef("bench", "dev-box", "main")


class _Variant:
    """One pod in which containers of one variant are created and removed, one per sample;
    ``prepare`` runs before each sample, untimed."""

    def __init__(
        self,
        cri: KubeletCri,
        pod: RunningPod,
        container: Callable[[int], ContainerSpec],
        prepare: Callable[[], None] | None = None,
    ) -> None:
        self.cri = cri
        self.pod = pod
        self.container = container
        self.prepare = prepare
        self.count = 0

    def sample(self) -> float:
        if self.prepare is not None:
            self.prepare()
        self.count += 1
        spec = self.container(self.count)
        began = time.perf_counter()
        cid = self.cri.create_container(self.pod, spec)
        self.cri.start_container(cid)
        elapsed = (time.perf_counter() - began) * 1000
        self.cri.remove_container_of(self.pod, spec.name)
        return elapsed


def _pod(rig: CriRig, name: str, handler: str) -> RunningPod:
    assert rig.cri is not None
    return rig.cri.run_pod(PodSpec("bench", name, runtime_handler=handler))


class _PluginSwitch:
    """NRI mode's baseline: the same containerd with our plugin disconnected (NRI calls no
    plugin then), connected again before the other variants."""

    def __init__(self, rig: CriRig) -> None:
        self.plugin = rig.service.plugin

    def off(self) -> None:
        if self.plugin.connected:
            self.plugin.stop()
            time.sleep(0.2)  # containerd notices the closed connection and drops the plugin

    def on(self) -> None:
        if not self.plugin.connected:
            self.plugin.start()
            if not self.plugin.wait_synchronized(15):
                raise RuntimeError(f"the NRI plugin did not register again: {self.plugin.status()}")
            time.sleep(0.1)  # registration's own work settles


def variants(rig: CriRig) -> dict[str, _Variant]:
    """The three variants of the module docstring on a started rig."""
    assert rig.cri is not None

    def plain(n: int) -> ContainerSpec:
        return ContainerSpec(f"c{n}", args=["sleep", "100000"])

    def spot(n: int) -> ContainerSpec:
        return ContainerSpec(f"c{n}", args=["sleep", "100000"], resources={SPOT_GPU_RESOURCE: 1})

    switch = _PluginSwitch(rig) if rig.mode == "nri" else None
    return {
        "plain": _Variant(rig.cri, _pod(rig, "plain", "runc"), plain, switch.off if switch else None),
        "passthrough": _Variant(rig.cri, _pod(rig, "passthrough", rig.handler), plain, switch.on if switch else None),
        "sync": _Variant(rig.cri, _pod(rig, "spot-job", rig.handler), spot, switch.on if switch else None),
    }


def rounds(chosen: dict[str, _Variant], runs: int, warmup: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in chosen}
    names = list(chosen)
    for number in range(warmup + runs):
        order = names[number % len(names) :] + names[: number % len(names)]
        for name in order:
            value = chosen[name].sample()
            if number >= warmup:
                samples[name].append(value)
    return samples


def measure(
    base: Path, version: str, mode: Mode, runs: int, warmup: int, *, background_load: int = 0
) -> dict[str, Any]:
    build = binaries(version)  # type: ignore[arg-type]
    images = [pause_image(base / "images"), busybox_image(base / "images")]
    before = env.load_average()
    rig = CriRig(base / "node", build, mode, images)
    try:
        rig.start()
        rig.owner(OWNER, ["GPU-0", "GPU-1"])
        with env.background_load(background_load):
            samples = rounds(variants(rig), runs, warmup)
        assert rig.cri is not None
        version_answer = rig.cri.version()
    finally:
        rig.stop()

    def added(name: str) -> float:
        return median_ms([a - b for a, b in zip(samples[name], samples["plain"], strict=True)])

    targets = TARGETS[mode]
    result: dict[str, Any] = {
        "cri": True,
        "mode": mode,
        "containerd": f"{version_answer.runtime_name} {version_answer.runtime_version}",
        "plain_ms_median": median_ms(samples["plain"]),
        "passthrough_added_ms": added("passthrough"),
        "sync_added_ms": added("sync"),
        "medians_ms": {name: median_ms(v) for name, v in samples.items()},
        "iqr_ms": {name: iqr_ms(v) for name, v in samples.items()},
        "runs": runs,
        "warmup": warmup,
        "targets": targets,
        "environment": env.environment(
            background_load=background_load,
            load_before=before,
            load_after=env.load_average(),
            containerd_binaries=[build.containerd],
            note=f"niceness {os.nice(0)}",
        ),
    }
    result["meets_targets"] = {k: result[k] <= v for k, v in targets.items()}
    return result


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    if os.geteuid() != 0 or shutil.which("runc") is None or not Path("/bin/busybox").exists():
        print("spotgpu bench runtime --cri: needs root, runc and /bin/busybox", file=sys.stderr)
        return 2
    if args.mode == "nri" and args.containerd == "1.6":
        print("spotgpu bench runtime --cri: containerd 1.6 has no NRI (--containerd 2.2)", file=sys.stderr)
        return 2
    if args.nice:
        os.nice(args.nice)
    base = Path(tempfile.mkdtemp(prefix="sg-bench-cri-", dir="/tmp"))
    try:
        result = measure(base, args.containerd, args.mode, args.runs, args.warmup, background_load=args.background_load)
    except FileNotFoundError as exc:
        print(f"spotgpu bench runtime --cri: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result["command"] = "spotgpu bench runtime " + " ".join(sys.argv[3:] if len(sys.argv) > 3 else [])
    result["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(result, sort_keys=True) if args.json else json.dumps(result, indent=2, sort_keys=True))
    return 0


__all__ = ["TARGETS", "measure", "run", "variants"]
