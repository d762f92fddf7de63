"""The owner's GPU client for the node end-to-end run: a small static C program.

Decides nothing. Side effects only in :func:`build_client` (writes the C file, runs ``gcc``).

The owner container runs it as its init, reading one command per line and printing one JSON
line per command (flushed), so the harness drives the owner like a developer at a terminal:

* ``hold DEV...``: open the devices and keep them open (the owner is "using its GPUs": a GPU
  process of the owner container, which the agent's device-node backend sees in ``/proc``);
* ``release``: close every held device (the owner went home: idle from now on);
* ``session DEV REQ``: start a new GPU session, i.e. issue ``ioctl(fd(DEV), REQ)`` the way a
  CUDA or NVML initialisation issues the driver's version check. Under the return guard's
  seccomp rule this call is what the guard holds while the agent evicts spot work. The reply
  carries the call's result and errno (ENOTTY from the stand-in device means the call reached
  the "driver"; ENOSYS would mean a guard without a listener), its start and end on
  ``CLOCK_MONOTONIC`` (comparable with the host's ``time.monotonic_ns()``: runc creates no time
  namespace) and its end on ``CLOCK_REALTIME`` (comparable with containerd's exit timestamps);
* ``ping``; ``exit``.

Run with arguments it is the attacker of the fd-passing attack (:mod:`spotgpu.e2e.faults`,
"gpu-fd-passed-to-cpu-pod"): ``e2eclient sendfd SOCKET DEV`` opens ``DEV`` (a spot container's
synced GPU), connects to the unix socket ``SOCKET`` (on a volume it shares with another pod) and
sends the fd with SCM_RIGHTS, then sleeps; ``e2eclient recvfd SOCKET [GO]`` listens there, keeps
the fd it receives and sleeps (an ordinary CPU pod now holding the owner's GPU); with ``GO`` it
accepts only once the file ``GO`` exists: until then the fd is in flight, held by no process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from spotgpu.testing.cbuild import compile_static

CLIENT_SOURCE: Final = r"""
/* e2eclient: the owner's GPU client of `spotgpu node-e2e` (see spotgpu/e2e/client.py). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_HELD 64

static int held[MAX_HELD];
static int nheld;
static unsigned char arg[16384] __attribute__((aligned(64)));

static long long clock_ns(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void reply_error(const char *op, const char *what, int err) {
    printf("{\"op\":\"%s\",\"error\":\"%s\",\"errno\":%d}\n", op, what, err);
}

static void cmd_hold(char **paths, int n) {
    int opened = 0, failed = 0, last = 0;
    for (int i = 0; i < n; i++) {
        if (nheld == MAX_HELD) { failed++; continue; }
        int fd = open(paths[i], O_RDWR | O_CLOEXEC);
        if (fd < 0) { failed++; last = errno; continue; }
        held[nheld++] = fd;
        opened++;
    }
    printf("{\"op\":\"hold\",\"opened\":%d,\"failed\":%d,\"errno\":%d,\"held\":%d}\n", opened, failed, last, nheld);
}

static void cmd_release(void) {
    int closed = 0;
    while (nheld > 0) {
        close(held[--nheld]);
        closed++;
    }
    printf("{\"op\":\"release\",\"closed\":%d,\"at_ns\":%lld}\n", closed, clock_ns(CLOCK_MONOTONIC));
}

static void cmd_session(const char *path, unsigned long request) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) { reply_error("session", "open", errno); return; }
    memset(arg, 0, sizeof arg);
    long long start = clock_ns(CLOCK_MONOTONIC);
    int rc = ioctl(fd, request, arg);
    int err = rc < 0 ? errno : 0;
    long long end = clock_ns(CLOCK_MONOTONIC);
    long long end_real = clock_ns(CLOCK_REALTIME);
    close(fd);
    printf("{\"op\":\"session\",\"rc\":%d,\"errno\":%d,\"start_ns\":%lld,\"end_ns\":%lld,\"end_real_ns\":%lld}\n",
           rc, err, start, end, end_real);
}

static int unix_socket(const char *path, struct sockaddr_un *addr) {
    memset(addr, 0, sizeof *addr);
    addr->sun_family = AF_UNIX;
    strncpy(addr->sun_path, path, sizeof addr->sun_path - 1);
    return socket(AF_UNIX, SOCK_STREAM, 0);
}

static int fd_send(const char *path, const char *dev) {
    struct sockaddr_un addr;
    int gpu = open(dev, O_RDWR), sock = unix_socket(path, &addr);
    if (gpu < 0 || sock < 0) return 2;
    while (connect(sock, (struct sockaddr *)&addr, sizeof addr) < 0) usleep(10000);
    char data = 'g', control[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&data, 1};
    struct msghdr msg = {0};
    msg.msg_iov = &iov; msg.msg_iovlen = 1; msg.msg_control = control; msg.msg_controllen = sizeof control;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET; c->cmsg_type = SCM_RIGHTS; c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &gpu, sizeof(int));
    if (sendmsg(sock, &msg, 0) != 1) return 3;
    for (;;) pause();
}

static int fd_recv(const char *path, const char *go) {
    struct sockaddr_un addr;
    int sock = unix_socket(path, &addr);
    unlink(path);
    if (sock < 0 || bind(sock, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(sock, 1) < 0) return 2;
    while (go && access(go, F_OK) != 0) usleep(10000); /* the fd waits in the socket's queue */
    int conn = accept(sock, NULL, NULL);
    char data, control[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&data, 1};
    struct msghdr msg = {0};
    msg.msg_iov = &iov; msg.msg_iovlen = 1; msg.msg_control = control; msg.msg_controllen = sizeof control;
    if (conn < 0 || recvmsg(conn, &msg, 0) != 1) return 3;
    for (;;) pause();
}

int main(int argc, char **argv) {
    static char line[8192];
    if (argc == 4 && strcmp(argv[1], "sendfd") == 0) return fd_send(argv[2], argv[3]);
    if ((argc == 3 || argc == 4) && strcmp(argv[1], "recvfd") == 0) return fd_recv(argv[2], argc == 4 ? argv[3] : NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin)) {
        char *words[MAX_HELD + 2];
        int n = 0;
        for (char *w = strtok(line, " \t\r\n"); w && n < MAX_HELD + 2; w = strtok(NULL, " \t\r\n")) words[n++] = w;
        if (n == 0) continue;
        if (strcmp(words[0], "exit") == 0) break;
        if (strcmp(words[0], "ping") == 0) printf("{\"op\":\"ping\",\"pid\":%d}\n", getpid());
        else if (strcmp(words[0], "hold") == 0) cmd_hold(words + 1, n - 1);
        else if (strcmp(words[0], "release") == 0) cmd_release();
        else if (strcmp(words[0], "session") == 0 && n == 3) cmd_session(words[1], strtoul(words[2], NULL, 0));
        else reply_error(words[0], "unknown command", 0);
        fflush(stdout);
    }
    return 0;
}
"""


def build_client(directory: Path) -> Path:
    """Compile ``e2eclient`` statically into ``directory``; returns the binary's path."""
    return compile_static(CLIENT_SOURCE, directory, "e2eclient")


__all__ = ["CLIENT_SOURCE", "build_client"]
