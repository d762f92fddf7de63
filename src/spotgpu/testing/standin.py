"""A stand-in GPU client for machines without a GPU: the ioctl sequences of NVIDIA session
starts, and a small static C program (``guardprobe``) that issues them on stand-in devices.

Decides nothing. Side effects only in :func:`build_probe` (writes the C file, runs ``gcc``).

The sequences are reconstructed from public sources: NVIDIA's open kernel modules
(``nv-ioctl-numbers.h``, ``nv_escape.h``, ``uvm_ioctl.h``), gVisor's nvproxy (which proxies
each of these escapes for CUDA and nvidia-smi, ``pkg/abi/nvgpu``) and several public RM
clients that open a session as: open ``/dev/nvidiactl`` -> ``NV_ESC_CHECK_VERSION_STR`` ->
card info -> ``RM_ALLOC`` of the root client -> register/attach the GPU fd -> device and
subdevice objects -> controls. A real ``cuInit`` issues hundreds of RM controls; the stand-in
keeps the structure (one version check per RM-client library init, then ordinary escapes and,
for CUDA, UVM's raw-numbered ioctls), which is what decides how often the guard is notified.
On the stand-in devices (``/dev/null``'s numbers) every ioctl returns ENOTTY harmlessly: ENOTTY
means the call reached the driver, ENOSYS would mean a guard without a listener.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from spotgpu.guard.rule import NV_ESC_CHECK_VERSION_STR, nv_ioctl
from spotgpu.testing.cbuild import compile_static

# Frontend escapes (nv-ioctl-numbers.h) with their parameter sizes (nv-ioctl.h, nvos.h); the
# encoding and the version check's number are the rule's (spotgpu.guard.rule).
CHECK_VERSION_STR: Final = nv_ioctl(NV_ESC_CHECK_VERSION_STR, 72)  # nv_ioctl_rm_api_version_t
SYS_PARAMS: Final = nv_ioctl(214, 8)  # nv_ioctl_sys_params_t
CARD_INFO: Final = nv_ioctl(200, 32 * 72)  # nv_ioctl_card_info_t[NV_MAX_DEVICES]
REGISTER_FD: Final = nv_ioctl(201, 4)  # nv_ioctl_register_fd_t
ATTACH_GPUS_TO_FD: Final = nv_ioctl(212, 4)  # NvU32[1]
RM_ALLOC: Final = nv_ioctl(0x2B, 48)  # NVOS64_PARAMETERS
RM_CONTROL: Final = nv_ioctl(0x2A, 32)  # NVOS54_PARAMETERS
RM_FREE: Final = nv_ioctl(0x29, 16)  # NVOS00_PARAMETERS
RM_MAP_MEMORY: Final = nv_ioctl(0x4E, 56)  # nv_ioctl_nvos33_parameters_with_fd
RM_VID_HEAP_CONTROL: Final = nv_ioctl(0x4A, 184)  # NVOS32_PARAMETERS
# UVM (uvm_ioctl.h, uvm_linux_ioctl.h): raw numbers, no _IOC encoding.
UVM_INITIALIZE: Final = 0x3000_0001
UVM_MM_INITIALIZE: Final = 75
UVM_PAGEABLE_MEM_ACCESS: Final = 39
UVM_REGISTER_GPU: Final = 37
UVM_CREATE_RANGE_GROUP: Final = 23
UVM_REGISTER_GPU_VASPACE: Final = 25
UVM_REGISTER_CHANNEL: Final = 27
UVM_MAP_EXTERNAL_ALLOCATION: Final = 33

CTL: Final = "/dev/nvidiactl"
GPU0: Final = "/dev/nvidia0"
UVM: Final = "/dev/nvidia-uvm"
STANDIN_DEVICES: Final = (CTL, GPU0, UVM)
"""Device paths the sequences use; tests create them as char devices with /dev/null's numbers."""


@dataclass(frozen=True, slots=True)
class Call:
    device: str
    request: int


def _rm_client_init(controls: int) -> list[Call]:
    """What libnvidia-ml and libcuda both do to open an RM session on one GPU."""
    return [
        Call(CTL, CHECK_VERSION_STR),
        Call(CTL, SYS_PARAMS),
        Call(CTL, CARD_INFO),
        Call(CTL, RM_ALLOC),  # NV01_ROOT_CLIENT
        *[Call(CTL, RM_CONTROL)] * 4,  # build version, probed / attached GPU IDs, GPU ID info
        Call(GPU0, REGISTER_FD),
        Call(CTL, ATTACH_GPUS_TO_FD),
        Call(CTL, RM_ALLOC),  # NV01_DEVICE_0
        Call(CTL, RM_ALLOC),  # NV20_SUBDEVICE_0
        *[Call(CTL, RM_CONTROL)] * controls,  # name, UUID, memory info, running processes, ...
    ]


NVML_SESSION: Final = (*_rm_client_init(controls=8), *[Call(CTL, RM_FREE)] * 3)
"""``nvmlInit`` and a device query, as ``nvidia-smi`` starts."""

CUDA_SESSION: Final = (
    *_rm_client_init(controls=12),
    Call(UVM, UVM_INITIALIZE),
    Call(UVM, UVM_MM_INITIALIZE),
    Call(UVM, UVM_PAGEABLE_MEM_ACCESS),
    Call(UVM, UVM_REGISTER_GPU),
    Call(UVM, UVM_CREATE_RANGE_GROUP),
    *[Call(CTL, RM_ALLOC)] * 4,  # VA space, channel group, channels
    Call(UVM, UVM_REGISTER_GPU_VASPACE),
    Call(CTL, RM_VID_HEAP_CONTROL),
    Call(CTL, RM_MAP_MEMORY),
    *[Call(UVM, UVM_REGISTER_CHANNEL)] * 2,
    Call(UVM, UVM_MAP_EXTERNAL_ALLOCATION),
    *[Call(CTL, RM_CONTROL)] * 8,
)
"""``cuInit`` and a first context."""

TORCH_SESSION: Final = (*NVML_SESSION, *CUDA_SESSION)
"""A PyTorch-style start: NVML (device count) and then the CUDA driver, in one process."""

SESSIONS: Final = {"nvidia-smi": NVML_SESSION, "cuda-init": CUDA_SESSION, "torch-init": TORCH_SESSION}

STEADY_STATE: Final = (
    Call(CTL, RM_CONTROL),
    Call(CTL, RM_ALLOC),
    Call(CTL, RM_FREE),
    Call(CTL, RM_MAP_MEMORY),
    Call(UVM, UVM_MAP_EXTERNAL_ALLOCATION),
)
"""Ordinary GPU work of a running session; none of it may reach the guard."""


def sequence_arg(calls: Sequence[Call]) -> str:
    """``guardprobe seq`` argument: ``path:request,...``."""
    return ",".join(f"{c.device}:{c.request:#x}" for c in calls)


PROBE_SOURCE: Final = r"""
/* guardprobe: a stand-in GPU client for spotgpu's return guard (tests and benchmark).
 * One-shot:  guardprobe call DEV REQ | loop DEV REQ N | seq DEV:REQ,DEV:REQ,...
 * Serve:     guardprobe serve   (reads the same commands from stdin, one per line; "exit" ends)
 * Every command prints one JSON line. Times are CLOCK_MONOTONIC nanoseconds, comparable with
 * the host's time.monotonic_ns() (runc creates no time namespace). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static unsigned char buf[16384] __attribute__((aligned(64)));
static struct { char path[256]; int fd; } devs[32];
static int ndevs;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int dev_fd(const char *path) {
    for (int i = 0; i < ndevs; i++)
        if (strcmp(devs[i].path, path) == 0) return devs[i].fd;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 || ndevs == 32) return -1;
    snprintf(devs[ndevs].path, sizeof devs[ndevs].path, "%s", path);
    devs[ndevs++].fd = fd;
    return fd;
}

static void cmd_call(const char *path, unsigned long req) {
    int fd = dev_fd(path);
    if (fd < 0) { printf("{\"op\":\"call\",\"error\":\"open %s: %d\"}\n", path, errno); return; }
    memset(buf, 0, sizeof buf);
    long long t0 = now_ns();
    int rc = ioctl(fd, req, buf);
    int e = rc < 0 ? errno : 0;
    long long t1 = now_ns();
    printf("{\"op\":\"call\",\"rc\":%d,\"errno\":%d,\"start_ns\":%lld,\"end_ns\":%lld}\n", rc, e, t0, t1);
}

static void cmd_loop(const char *path, unsigned long req, long n) {
    int fd = dev_fd(path);
    if (fd < 0) { printf("{\"op\":\"loop\",\"error\":\"open %s: %d\"}\n", path, errno); return; }
    long unexpected = 0;
    int last = 0;
    long long t0 = now_ns();
    for (long i = 0; i < n; i++) {
        if (ioctl(fd, req, buf) < 0 && errno != ENOTTY) { unexpected++; last = errno; }
    }
    long long t1 = now_ns();
    printf("{\"op\":\"loop\",\"n\":%ld,\"ns_per_call\":%.3f,\"unexpected_errors\":%ld,\"last_errno\":%d}\n",
           n, n ? (double)(t1 - t0) / n : 0.0, unexpected, last);
}

static void cmd_seq(char *spec) {
    long calls = 0, enotty = 0, enosys = 0, other = 0, ok = 0;
    long long t0 = now_ns(), worst = 0;
    for (char *item = strtok(spec, ","); item; item = strtok(NULL, ",")) {
        char *colon = strrchr(item, ':');
        if (!colon) continue;
        *colon = 0;
        int fd = dev_fd(item);
        if (fd < 0) { other++; continue; }
        unsigned long req = strtoul(colon + 1, NULL, 0);
        memset(buf, 0, 256);
        long long a = now_ns();
        int rc = ioctl(fd, req, buf);
        int e = rc < 0 ? errno : 0;
        long long d = now_ns() - a;
        if (d > worst) worst = d;
        calls++;
        if (rc == 0) ok++; else if (e == ENOTTY) enotty++; else if (e == ENOSYS) enosys++; else other++;
    }
    long long t1 = now_ns();
    printf("{\"op\":\"seq\",\"calls\":%ld,\"ok\":%ld,\"enotty\":%ld,\"enosys\":%ld,\"other\":%ld,"
           "\"start_ns\":%lld,\"end_ns\":%lld,\"worst_ns\":%lld}\n",
           calls, ok, enotty, enosys, other, t0, t1, worst);
}

static int run(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[0], "call") == 0) cmd_call(argv[1], strtoul(argv[2], NULL, 0));
    else if (argc >= 4 && strcmp(argv[0], "loop") == 0) cmd_loop(argv[1], strtoul(argv[2], NULL, 0), atol(argv[3]));
    else if (argc >= 2 && strcmp(argv[0], "seq") == 0) cmd_seq(argv[1]);
    else if (argc >= 1 && strcmp(argv[0], "ping") == 0) printf("{\"op\":\"ping\",\"pid\":%d}\n", getpid());
    else return -1;
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "serve") == 0) {
        static char line[1 << 16];
        while (fgets(line, sizeof line, stdin)) {
            char *words[8];
            int n = 0;
            for (char *w = strtok(line, " \t\r\n"); w && n < 8; w = strtok(NULL, " \t\r\n")) words[n++] = w;
            if (n == 0) continue;
            if (strcmp(words[0], "exit") == 0) break;
            if (run(n, words) < 0) { printf("{\"op\":\"error\",\"command\":\"%s\"}\n", words[0]); fflush(stdout); }
        }
        return 0;
    }
    if (argc < 2 || run(argc - 1, argv + 1) < 0) {
        fprintf(stderr, "usage: guardprobe call DEV REQ | loop DEV REQ N | seq DEV:REQ,... | ping | serve\n");
        return 2;
    }
    return 0;
}
"""


def build_probe(directory: Path) -> Path:
    """Compile ``guardprobe`` statically into ``directory``; returns the binary's path."""
    return compile_static(PROBE_SOURCE, directory, "guardprobe")


__all__ = [
    "CHECK_VERSION_STR",
    "CUDA_SESSION",
    "NVML_SESSION",
    "PROBE_SOURCE",
    "SESSIONS",
    "STANDIN_DEVICES",
    "STEADY_STATE",
    "TORCH_SESSION",
    "Call",
    "build_probe",
    "sequence_arg",
]
