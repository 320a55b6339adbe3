"""Run untrusted, model-generated Python (HumanEval / MBPP checks) in a contained child process.

Layers, outermost first:

* a separate interpreter (``-I -B -S``: isolated, no bytecode files, standard library only) in its
  own session (the whole process group is SIGKILLed on timeout), with a fresh private working
  directory, a minimal environment (``PATH``, ``HOME`` and ``TMPDIR`` only), no stdin, and
  stdout/stderr redirected to files in a second, parent-owned directory, of which at most
  ``max_output_bytes`` are read back;
* kernel resource limits set before ``exec``: CPU time, address space, file size, open files,
  processes (not enforced for root; for other users it also forbids threads) and no core dumps;
* a guard executed in the child before the program (the idea of HumanEval's ``reliability_guard``,
  written anew) that replaces process creation, signals to other processes, sockets, privilege
  changes and filesystem writes or deletions outside the working directory with functions raising
  ``PermissionError``, and blocks imports of ``ctypes``, ``resource`` and the like.

The guard lives in the same interpreter as the program, so it stops accidents and naive misuse, not
a deliberate attacker (who can, e.g., dig the original functions out of the wrappers' closures).
For code that may be hostile, run the benchmark as an unprivileged user inside a container without
network; the resource limits and the process-group kill hold regardless.
"""

from __future__ import annotations

import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from exitbench.errors import ExitbenchError

Status = Literal["passed", "failed", "timeout", "error"]

_RUNNER_NAME = "_exitbench_runner.py"
_PROGRAM_NAME = "program.py"
_RUNNER_ERROR = 70  # the runner's own exit status when it cannot set the guard up (EX_SOFTWARE)
_MIN_FILE_SIZE = 8 * 2**20  # RLIMIT_FSIZE floor: room for the program's own scratch files
_MAX_OPEN_FILES = 64

# Executed by the child interpreter as a script. Kept as text (never imported here), since the guard
# disables the calling process.
_RUNNER_SOURCE = r'''"""exitbench sandbox runner: install the guard, then run the program; exit 0 iff it completes.

The guard patches the C-level modules (posix, _io, _socket, _posixsubprocess, _signal), so the Python
modules built on them (os, io, pathlib, shutil, socket, subprocess, multiprocessing, asyncio, ...)
inherit the blocks whether they are imported before or after it.
"""
import builtins
import os
import sys

BLOCKED_IMPORTS = frozenset({
    "ctypes", "_ctypes", "cffi", "_cffi_backend", "resource", "psutil",
    "posix", "_posixsubprocess", "_socket", "_io", "_signal",
})
PROCESS_CALLS = (
    "fork", "forkpty", "system", "popen", "execv", "execve", "posix_spawn", "posix_spawnp",
    "kill", "killpg", "pidfd_open", "_exit", "setsid", "setpgid", "setpgrp", "setuid", "setgid",
    "seteuid", "setegid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "chroot",
    "unshare", "setns",
)
NETWORK_CALLS = (
    "socketpair", "getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo",
)
WRITE_MODE_CHARS = frozenset("wax+")


def install_guard(root):
    """Replace process, signal, network and outside-``root`` filesystem calls with PermissionError."""
    import _io
    import _posixsubprocess
    import _signal
    import _socket
    import io
    import posix

    readlink, realpath, fsdecode, fspath = os.readlink, os.path.realpath, os.fsdecode, os.fspath
    dirname, basename, join, isabs = os.path.dirname, os.path.basename, os.path.join, os.path.isabs
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    prefix = root.rstrip(os.sep) + os.sep

    def denied(name):
        def blocked(*args, **kwargs):
            raise PermissionError(f"sandbox: {name} is not allowed")
        return blocked

    def resolve(path, dir_fd, follow):
        if isinstance(path, int):
            return realpath(readlink(f"/proc/self/fd/{path}"))
        text = fsdecode(fspath(path))
        if dir_fd is not None and not isabs(text):
            text = join(readlink(f"/proc/self/fd/{dir_fd}"), text)
        name = basename(text)
        if follow or name in ("", ".", ".."):
            return realpath(text)
        return join(realpath(dirname(text) or "."), name)

    def check(name, path, dir_fd=None, follow=True):
        try:
            target = resolve(path, dir_fd, follow)
        except (OSError, TypeError, ValueError):
            target = None
        if target is None or not (target == root or target.startswith(prefix) or target == os.devnull):
            raise PermissionError(f"sandbox: {name} outside the sandbox directory is not allowed: {path!r}")

    def set_everywhere(modules, name, value):
        for module in modules:
            if module is not None and hasattr(module, name):
                setattr(module, name, value)

    os_modules = (posix, os)

    def guard_paths(name, specs):
        original = getattr(posix, name, None)
        if original is None:
            return

        def guarded(*args, **kwargs):
            for index, keyword, fd_keyword, follow in specs:
                if index < len(args):
                    check(f"os.{name}", args[index], kwargs.get(fd_keyword), follow)
                elif keyword in kwargs:
                    check(f"os.{name}", kwargs[keyword], kwargs.get(fd_keyword), follow)
            return original(*args, **kwargs)

        set_everywhere(os_modules, name, guarded)

    def is_write(mode):
        return isinstance(mode, str) and not WRITE_MODE_CHARS.isdisjoint(mode)

    # Filesystem: writes, deletions and metadata changes only inside root (shutil, pathlib, tempfile
    # and os.removedirs/renames all go through these).
    for name in ("remove", "unlink", "rmdir", "mkdir", "mkfifo", "mknod", "lchown"):
        guard_paths(name, ((0, "path", "dir_fd", False),))
    for name in ("chmod", "chown", "truncate", "utime", "setxattr", "removexattr"):
        guard_paths(name, ((0, "path", "dir_fd", True),))
    for name in ("fchmod", "fchown"):
        guard_paths(name, ((0, "fd", None, True),))
    for name in ("rename", "replace"):
        guard_paths(name, ((0, "src", "src_dir_fd", False), (1, "dst", "dst_dir_fd", False)))
    guard_paths("link", ((0, "src", "src_dir_fd", True), (1, "dst", "dst_dir_fd", False)))
    guard_paths("symlink", ((1, "dst", "dir_fd", False),))

    os_open = posix.open

    def guarded_os_open(path, flags, *args, **kwargs):
        if isinstance(flags, int) and flags & write_flags:
            check("os.open", path, kwargs.get("dir_fd"))
        return os_open(path, flags, *args, **kwargs)

    set_everywhere(os_modules, "open", guarded_os_open)

    file_open = _io.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if not isinstance(file, int) and is_write(mode):
            check("open", file)
        return file_open(file, mode, *args, **kwargs)

    builtins.open = io.open = _io.open = guarded_open

    class GuardedFileIO(_io.FileIO):
        def __init__(self, file, mode="r", closefd=True, opener=None):
            if not isinstance(file, int) and is_write(mode):
                check("FileIO", file)
            super().__init__(file, mode, closefd, opener)

    io.FileIO = _io.FileIO = GuardedFileIO

    # Processes (subprocess and multiprocessing end in posix or _posixsubprocess), signals to other
    # processes, privileges.
    for name in PROCESS_CALLS:
        set_everywhere(os_modules, name, denied(f"os.{name}"))
    _posixsubprocess.fork_exec = denied("subprocess (_posixsubprocess.fork_exec)")
    set_everywhere((_signal, sys.modules.get("signal")), "pidfd_send_signal", denied("signal.pidfd_send_signal"))

    # Network: socket.socket subclasses _socket.socket and calls its __init__, so this blocks both.
    original_socket = _socket.socket

    class GuardedSocket(original_socket):
        __slots__ = ()  # socket.socket adds its own __weakref__ slot

        def __init__(self, *args, **kwargs):
            raise PermissionError("sandbox: socket.socket is not allowed")

    socket_modules = (_socket, sys.modules.get("socket"))
    set_everywhere(socket_modules, "socket", GuardedSocket)
    set_everywhere(socket_modules, "SocketType", GuardedSocket)
    for name in NETWORK_CALLS:
        set_everywhere(socket_modules, name, denied(f"socket.{name}"))

    # Imports: nothing that reaches libc or the limits, and no fresh copies of the patched modules.
    class ImportBlocker:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED_IMPORTS:
                raise ImportError(f"sandbox: importing {name} is not allowed")
            return None

    sys.meta_path.insert(0, ImportBlocker)
    for name in BLOCKED_IMPORTS:
        sys.modules.setdefault(name, None)


def report_exception():
    try:
        import traceback

        traceback.print_exc()
    except BaseException:
        pass


def main():
    exit_now = os._exit
    root = os.path.realpath(os.getcwd())
    program_path = os.path.join(root, sys.argv[1])
    try:
        with open(program_path, "rb") as handle:
            source = handle.read()
        install_guard(root)
    except BaseException:
        report_exception()
        sys.stderr.flush()
        exit_now(__RUNNER_ERROR__)
    status = 0
    try:
        exec(compile(source, program_path, "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except BaseException:
        status = 1
        report_exception()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass
    exit_now(status)


main()
'''.replace("__RUNNER_ERROR__", str(_RUNNER_ERROR))


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run; ``passed`` iff the program ran to completion without an exception."""

    passed: bool
    status: Status
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float


def _limits(timeout_s: float, memory_mb: int, max_output_bytes: int) -> list[tuple[int, tuple[int, int]]]:
    """The (resource, (soft, hard)) limits for the child, capped by the parent's own hard limits."""
    cpu = math.ceil(timeout_s) + 1
    wanted = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (memory_mb * 2**20,) * 2),
        (resource.RLIMIT_FSIZE, (max(_MIN_FILE_SIZE, max_output_bytes + 1),) * 2),
        (resource.RLIMIT_NOFILE, (_MAX_OPEN_FILES,) * 2),
        (resource.RLIMIT_NPROC, (1, 1)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    capped = []
    for kind, (soft, hard) in wanted:
        ceiling = resource.getrlimit(kind)[1]
        if ceiling != resource.RLIM_INFINITY:
            soft, hard = min(soft, ceiling), min(hard, ceiling)
        capped.append((kind, (soft, hard)))
    return capped


def _read_capped(path: str, max_bytes: int) -> str:
    """At most ``max_bytes`` of a file, decoded as UTF-8 with replacement characters."""
    with open(path, "rb") as handle:
        return handle.read(max_bytes).decode("utf-8", errors="replace")


def _kill_group(pid: int) -> None:
    """SIGKILL the child's whole process group (it leads its own session), ignoring a group already gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _classify(returncode: int, timed_out: bool) -> tuple[Status, str]:
    """Status for an exit code, and a note for stderr when the child died of a signal."""
    if timed_out:
        return "timeout", "[exitbench sandbox] wall-clock timeout: process group killed"
    if returncode == 0:
        return "passed", ""
    if returncode == _RUNNER_ERROR:
        return "error", ""
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        status: Status = "timeout" if -returncode == signal.SIGXCPU else "failed"
        return status, f"[exitbench sandbox] terminated by {name}"
    return "failed", ""


def run_program(
    program: str, timeout_s: float = 10.0, memory_mb: int = 1024, max_output_bytes: int = 65536
) -> SandboxResult:
    """Run ``program`` in a contained child interpreter; failures of any kind come back as a result."""
    if not isinstance(program, str):
        raise ExitbenchError(f"run_program: program must be a string, got {type(program).__name__}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
        raise ExitbenchError(f"run_program: timeout_s must be a positive finite number of seconds, got {timeout_s!r}")
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb <= 0:
        raise ExitbenchError(f"run_program: memory_mb must be a positive integer, got {memory_mb!r}")
    if isinstance(max_output_bytes, bool) or not isinstance(max_output_bytes, int) or max_output_bytes < 0:
        raise ExitbenchError(f"run_program: max_output_bytes must be a non-negative integer, got {max_output_bytes!r}")

    limits = _limits(timeout_s, memory_mb, max_output_bytes)

    def set_limits() -> None:  # runs in the child between fork and exec: C calls only
        for kind, pair in limits:
            resource.setrlimit(kind, pair)

    start = time.monotonic()
    workdir: str | None = None  # the child's working directory, which it may write to
    outdir: str | None = None  # the parent's: stdout and stderr files, out of the child's reach
    proc: subprocess.Popen[bytes] | None = None
    try:
        workdir = tempfile.mkdtemp(prefix="exitbench_sandbox_")
        outdir = tempfile.mkdtemp(prefix="exitbench_output_")
        with open(os.path.join(workdir, _RUNNER_NAME), "w", encoding="utf-8") as handle:
            handle.write(_RUNNER_SOURCE)
        with open(os.path.join(workdir, _PROGRAM_NAME), "w", encoding="utf-8") as handle:
            handle.write(program)
        out_path, err_path = os.path.join(outdir, "stdout"), os.path.join(outdir, "stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-S", _RUNNER_NAME, _PROGRAM_NAME],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=workdir,
                env={"PATH": os.environ.get("PATH", os.defpath), "HOME": workdir, "TMPDIR": workdir},
                start_new_session=True,
                close_fds=True,
                preexec_fn=set_limits,
            )
        timed_out = False
        try:
            proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            proc.wait()
        _kill_group(proc.pid)  # leftovers, should anything have escaped the guard
        status, note = _classify(proc.returncode, timed_out)
        stderr = _read_capped(err_path, max_output_bytes)
        if note:
            stderr = f"{stderr}\n{note}" if stderr else note
        return SandboxResult(
            passed=status == "passed",
            status=status,
            returncode=None if timed_out else proc.returncode,
            stdout=_read_capped(out_path, max_output_bytes),
            stderr=stderr,
            duration_s=time.monotonic() - start,
        )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return SandboxResult(False, "error", None, "", f"[exitbench sandbox] {exc!r}", time.monotonic() - start)
    finally:
        if proc is not None and proc.poll() is None:
            _kill_group(proc.pid)
            proc.wait()
        for directory in (workdir, outdir):
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)


def check_completion(
    prompt: str, completion: str, test: str, entry_point: str, timeout_s: float = 10.0
) -> SandboxResult:
    """Run a HumanEval check: ``prompt + completion``, the test code, then ``check(entry_point)``."""
    if not isinstance(entry_point, str) or not entry_point.isidentifier():
        raise ExitbenchError(f"check_completion: entry_point must be a Python identifier, got {entry_point!r}")
    program = prompt + completion + "\n" + test + "\n" + f"check({entry_point})\n"
    return run_program(program, timeout_s=timeout_s)


def check_mbpp(
    code: str, test_list: Sequence[str], test_setup_code: str = "", timeout_s: float = 10.0
) -> SandboxResult:
    """Run an MBPP check: the code, then the setup code, then each assert of ``test_list``."""
    if isinstance(test_list, str):
        raise ExitbenchError("check_mbpp: test_list must be a list of assert statements, not one string")
    program = "\n".join([code, test_setup_code, *test_list]) + "\n"
    return run_program(program, timeout_s=timeout_s)
