"""spotgpu's NRI plugin as a process of its own, so a test can SIGKILL it mid-create.

``python nri_plugin_proc.py SETTINGS.json``: the settings name the NRI socket, the kubelet
sockets, the owner record (written by the test with :func:`write_owner_state`) and the guard's
listener. Prints ``synchronized`` once registered, then serves until killed.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from spotgpu.nri.host import NriRuntime, nri_guard_functions
from spotgpu.nri.plugin import NriPlugin
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.runtime.engine import SpecEngine
from spotgpu.runtime.modifiers import load_guard_functions
from spotgpu.runtime.node import KubeletNodeLookup, LinuxHost
from spotgpu.runtime.ownerstate import OwnerStateFile


def main() -> int:
    settings = json.loads(Path(sys.argv[1]).read_text())
    config = RuntimeConfig(
        device_plugin_dir=Path(settings["device_plugin_dir"]),
        pod_resources_socket=Path(settings["pod_resources_socket"]),
        guard_listener_path=Path(settings["listener"]),
        device_plugin_sockets=settings["device_plugin_sockets"],
        kubelet_timeout=30.0,
    )
    owners = OwnerStateFile(Path(settings["owner_state"]))
    lookup = KubeletNodeLookup.from_config(config, owners.owner_of, exclude_sockets=("spotgpu-spot-gpu.sock",))
    engine = SpecEngine(config, lookup, LinuxHost(), guard=nri_guard_functions(load_guard_functions()))
    plugin = NriPlugin(Path(settings["nri_socket"]), NriRuntime(engine), index="60").start()
    if plugin.wait_synchronized(15):
        print("synchronized", flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
