"""runc's command line, as containerd's shim writes it: which verb, which bundle, where runc logs.

Pure; no side effects. Imported by the per-call wrapper (:mod:`spotgpu.runtime.wrapper`) that
runs on the host for every ``create`` we must modify, so it is written for start-up speed and
for any host ``python3`` >= 3.8: built-in types only, no ``re``, ``dataclasses``, ``typing`` or
``enum`` at run time (each costs milliseconds of imports on every container creation).

The grammar (runc 1.1 uses urfave/cli v1 over Go's ``flag`` package):

* ``runc [global flags] COMMAND [command flags and arguments]``.
* A flag is ``-name`` or ``--name``, optionally ``=value``. A flag that takes a value and has no
  ``=`` consumes the next argument, whatever it looks like (Go's ``flag``). ``-`` alone is an
  argument, not a flag; ``--`` ends the flags.
* Global flags with a value: ``--log``, ``--log-format``, ``--root``, ``--criu``,
  ``--rootless``; all other global flags are booleans. The first non-flag argument is the
  command. So ``runc --root create state x`` runs ``state``: ``create`` is the root directory.
* After the command, urfave/cli moves flags in front of positional arguments, so a flag may
  follow the container ID; we scan every argument up to ``--``. ``create``'s flags with a value:
  ``--bundle``/``-b``, ``--console-socket``, ``--pid-file``, ``--preserve-fds``,
  ``--pidfd-socket``. The last ``--bundle`` wins; no bundle flag means the current directory.
  An empty bundle value also means the current directory.
* A value flag at the very end (no value) makes the command line malformed: we then modify
  nothing and let the lower runtime print its own usage error.

The shell fast path (:mod:`spotgpu.runtime.shim`) implements the same grammar in POSIX sh; a
property test runs both on generated command lines and requires the same decision.
"""

from __future__ import annotations

GLOBAL_VALUE_FLAGS = frozenset(("log", "log-format", "root", "criu", "rootless"))
"""runc's global flags that take a value (``runc --help``, runc 1.1)."""

CREATE_VALUE_FLAGS = frozenset(("bundle", "b", "console-socket", "pid-file", "preserve-fds", "pidfd-socket"))
"""``runc create``'s flags that take a value (``pidfd-socket`` is runc >= 1.2)."""

BUNDLE_FLAGS = frozenset(("bundle", "b"))


def _flag_name(arg: str) -> tuple[str, bool] | None:
    """``(name, has_inline_value)`` for a flag argument; None for a positional argument.

    ``-`` is positional; ``--`` is handled by the callers.
    """
    if len(arg) < 2 or arg[0] != "-":
        return None
    body = arg[2:] if arg[1] == "-" else arg[1:]
    name, sep, _ = body.partition("=")
    return name, bool(sep)


class RuncArgs:
    """What the wrapper needs to know about one runc command line."""

    __slots__ = ("bundle", "command", "container_id", "log_format", "log_path", "malformed")

    def __init__(
        self,
        command: str | None,
        bundle: str,
        log_path: str | None,
        log_format: str | None,
        *,
        malformed: bool = False,
        container_id: str | None = None,
    ) -> None:
        self.command = command
        """The subcommand (``create``, ``kill``, ...); None when there is none (``--version``)."""
        self.bundle = bundle
        """The bundle directory (``.`` when not given); meaningful for ``create`` only."""
        self.log_path = log_path
        """The global ``--log`` file, where containerd's shim reads runc's last error."""
        self.log_format = log_format
        """The global ``--log-format`` (``json`` from containerd; runc's default is ``text``)."""
        self.malformed = malformed
        """A value flag lacked its value; the wrapper then changes nothing."""
        self.container_id = container_id
        """``create``'s first positional argument (for messages only)."""

    @property
    def is_create(self) -> bool:
        """True only for a well-formed ``create`` command."""
        return self.command == "create" and not self.malformed

    @property
    def config_path(self) -> str:
        """The bundle's ``config.json`` (relative to the working directory when the bundle is)."""
        return self.bundle + ("config.json" if self.bundle.endswith("/") else "/config.json")

    def _key(self) -> tuple[str | None, str, str | None, str | None, bool, str | None]:
        return (self.command, self.bundle, self.log_path, self.log_format, self.malformed, self.container_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RuncArgs) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"RuncArgs(command={self.command!r}, bundle={self.bundle!r}, log_path={self.log_path!r}, "
            f"log_format={self.log_format!r}, malformed={self.malformed!r}, container_id={self.container_id!r})"
        )


def parse(argv: list[str] | tuple[str, ...]) -> RuncArgs:
    """Parse runc's arguments (without the program name). Never raises."""
    log_path: str | None = None
    log_format: str | None = None
    command: str | None = None
    i, n = 0, len(argv)
    # Global flags up to the command.
    while i < n:
        arg = argv[i]
        if arg == "--":
            if i + 1 < n:
                command = argv[i + 1]
                i += 2
            else:
                i += 1
            break
        flag = _flag_name(arg)
        if flag is None:
            command = arg
            i += 1
            break
        name, inline = flag
        value: str | None = None
        if name in GLOBAL_VALUE_FLAGS:
            if inline:
                value = arg.split("=", 1)[1]
            elif i + 1 < n:
                value = argv[i + 1]
                i += 1
            else:
                return RuncArgs(None, ".", log_path, log_format, malformed=True)
        if name == "log":
            log_path = value
        elif name == "log-format":
            log_format = value
        i += 1
    if command != "create":
        return RuncArgs(command, ".", log_path, log_format)
    # create's flags, anywhere before "--".
    bundle = "."
    container_id: str | None = None
    while i < n:
        arg = argv[i]
        if arg == "--":
            if container_id is None and i + 1 < n:
                container_id = argv[i + 1]
            break
        flag = _flag_name(arg)
        i += 1
        if flag is None:
            if container_id is None:
                container_id = arg
            continue
        name, inline = flag
        if name not in CREATE_VALUE_FLAGS:
            continue
        if inline:
            value = arg.split("=", 1)[1]
        elif i < n:
            value = argv[i]
            i += 1
        else:
            return RuncArgs(command, bundle, log_path, log_format, malformed=True, container_id=container_id)
        if name in BUNDLE_FLAGS:
            bundle = value or "."
    return RuncArgs(command, bundle, log_path, log_format, container_id=container_id)


__all__ = ["BUNDLE_FLAGS", "CREATE_VALUE_FLAGS", "GLOBAL_VALUE_FLAGS", "RuncArgs", "parse"]
