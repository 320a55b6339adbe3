"""The code sandbox against a hostile program: each case tries an escape and the test checks, from the
host, that it had no effect (no file, no connection, no process, no leaked secret, no forged pass).

The suite runs as whatever user runs pytest: as root in CI, and as an ordinary user through
``scripts/sandbox_as_user.sh`` (CI runs both).
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import resource
import socket
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from exitbench.errors import ExitbenchError
from exitbench.tasks import sandbox
from exitbench.tasks.sandbox import check_completion, check_mbpp, run_program

MIRROR = Path(os.environ.get("EXITBENCH_DATA_MIRROR", Path(__file__).resolve().parents[2] / "shared" / "data"))


def run(source: str, **kwargs) -> sandbox.SandboxResult:
    return run_program(textwrap.dedent(source), **kwargs)


def jail_ids(output: str) -> tuple[str, str]:
    """The jail's (pid, mnt) namespaces from a program that printed ``JAIL_IDS``."""
    line = next(line for line in output.splitlines() if line.startswith("jail "))
    return line.split()[1], line.split()[2]


JAIL_IDS = 'import os; print("jail", os.readlink("/proc/self/ns/pid"), os.readlink("/proc/self/ns/mnt"), flush=True)\n'


def host_leftovers(namespaces: tuple[str, str], temp_before: set[str]) -> dict[str, list]:
    """What the host still holds of a run: live processes in the jail's PID or mount namespace (a live mount
    namespace keeps the jail's RAM-backed folders), and new exitbench temp folders."""
    live = {kind: live_processes_in(name, kind) for kind, name in zip(("pid", "mnt"), namespaces, strict=True)}
    return {**live, "temp": sorted(exitbench_temp_folders() - temp_before)}


def live_processes_in(namespace: str, kind: str) -> list[int]:
    """The host's own view (independent of the sandbox's code): pids whose ``kind`` namespace is
    ``namespace``, zombies left out (they hold no memory, files or mounts)."""
    time.sleep(0.2)
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            state = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[0]
            if os.readlink(f"/proc/{pid}/ns/{kind}") == namespace and state not in (b"Z", b"X"):
                found.append(int(pid))
        except (OSError, IndexError):
            pass
    return found


def exitbench_temp_folders() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith("exitbench_")}


NOTHING_LEFT = {"pid": [], "mnt": [], "temp": []}


@pytest.fixture
def host_target(tmp_path: Path) -> Path:
    """A path on the host that no jailed program may create."""
    tmp_path.chmod(0o777)
    return tmp_path / f"escape-{uuid.uuid4().hex}"


# --- correct programs behave as in a normal interpreter ----------------------------------------------------


def test_a_correct_program_passes_and_prints() -> None:
    result = run("def add(a, b):\n    return a + b\nassert add(2, 3) == 5\nprint('ok')\n")
    assert (result.passed, result.status, result.returncode, result.stdout) == (True, "passed", 0, "ok\n")


def test_an_exception_fails_with_its_traceback() -> None:
    result = run("assert 1 + 1 == 3, 'arithmetic'\n")
    assert (result.passed, result.status, result.returncode) == (False, "failed", 1)
    assert "AssertionError: arithmetic" in result.stderr


def test_scratch_files_in_the_working_folder_and_tmp_are_allowed() -> None:
    result = run("""
        import os, tempfile
        open("scratch.txt", "w").write("x")
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "f"), "w").write("y")
        print(open("scratch.txt").read(), os.getcwd())
    """)
    assert result.passed and result.stdout.split() == ["x", "/sandbox"]


def test_the_jail_runs_unprivileged_even_when_the_pipeline_is_root() -> None:
    result = run("""
        import os
        status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines())
        print(os.getuid(), os.getgid(), int(status["CapEff"], 16), int(status["NoNewPrivs"]), status["Seccomp"])
    """)
    assert result.stdout.split() == ["65534", "65534", "0", "1", "2"]


# --- files ---------------------------------------------------------------------------------------------------

WRITES = {
    "open": "open(TARGET, 'w').write('x')",
    "os.open": "import os; os.close(os.open(TARGET, os.O_CREAT | os.O_WRONLY))",
    "sqlite3": "import sqlite3; sqlite3.connect(TARGET).execute('create table t(x)')",
    "readline history": "import readline; readline.write_history_file(TARGET)",
    "FileIO base class": "import io; io.FileIO.__bases__[0](TARGET, 'w')",
    "_io.FileIO": "import _io; _io.FileIO(TARGET, 'w').write(b'x')",
    "pathlib": "import pathlib; pathlib.Path(TARGET).write_text('x')",
    "shutil.copy": "import shutil; open('f', 'w').write('x'); shutil.copy('f', TARGET)",
    "os.link/rename": "import os; open('f', 'w').write('x'); os.rename('f', TARGET)",
    "mkdir": "import os; os.mkdir(TARGET)",
    "symlink": "import os; os.symlink('/etc/passwd', TARGET)",
    "ctypes libc open": "import ctypes; libc = ctypes.CDLL(None); libc.creat(TARGET.encode(), 0o644)",
}


@pytest.mark.parametrize("write", list(WRITES.values()), ids=list(WRITES))
def test_writes_outside_the_jail_never_reach_the_host(write: str, host_target: Path) -> None:
    run(f"TARGET = {str(host_target)!r}\n{write}\n")
    assert not host_target.exists() and not host_target.is_symlink()


@pytest.mark.parametrize("action", [
    "import os; os.remove(VICTIM)", "import os; os.chmod(VICTIM, 0o777)", "open(VICTIM, 'w').write('changed')",
    "import os; os.truncate(VICTIM, 0)",
])
def test_host_files_cannot_be_deleted_or_changed(action: str, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    victim.chmod(0o666)
    tmp_path.chmod(0o777)
    run(f"VICTIM = {str(victim)!r}\n{action}\n")
    assert victim.read_text() == "original" and victim.stat().st_mode & 0o777 == 0o666


def test_shared_memory_leaves_nothing_in_the_hosts_dev_shm() -> None:
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    result = run("""
        from multiprocessing import shared_memory
        block = shared_memory.SharedMemory(create=True, size=4096)
        print(block.name)
    """)
    after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert after - before == set()
    assert result.stdout.strip() == "" or result.stdout.strip() not in after


def test_the_hosts_files_are_not_visible() -> None:
    repo_file = Path(__file__).resolve()
    result = run(f"""
        import os
        for path in ({str(repo_file)!r}, "/etc/shadow", "/etc/passwd", "/home", "/work", "/var"):
            print(path, os.path.exists(path))
        print(sorted(os.listdir("/")))
    """)
    *checks, top = result.stdout.splitlines()
    assert result.passed and all(line.endswith(" False") for line in checks)
    python_tops = {"/" + Path(root).parts[1] for root in sandbox.python_roots()}
    allowed = {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr", "/proc", "/dev", "/tmp", "/sandbox",
               "/src"} | python_tops
    assert {"/" + name for name in json.loads(top.replace("'", '"'))} <= allowed


def test_disk_filling_is_capped_by_the_jails_own_tmpfs() -> None:
    start = time.monotonic()
    result = run("""
        chunk = b"x" * 2**20
        for i in range(4096):
            with open(f"fill{i}", "wb") as handle:
                handle.write(chunk)
    """, timeout_s=20)
    assert not result.passed and "No space left" in result.stderr
    assert time.monotonic() - start < 15


# --- environment and the parent -------------------------------------------------------------------------------


def test_the_parents_environment_is_not_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXITBENCH_TEST_SECRET", "s3cret-token")
    result = run("import os; print(sorted(os.environ))")
    assert "EXITBENCH_TEST_SECRET" not in result.stdout and "s3cret" not in result.stdout


def test_the_parents_proc_environ_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXITBENCH_TEST_SECRET", "s3cret-token")
    result = run(f"""
        import os
        for pid in ({os.getpid()}, os.getppid(), 1):
            try:
                print(open(f"/proc/{{pid}}/environ", "rb").read())
            except OSError as err:
                print(pid, type(err).__name__)
    """)
    assert "s3cret" not in result.stdout


def test_only_the_jails_own_processes_are_visible() -> None:
    result = run("import os; print([p for p in os.listdir('/proc') if p.isdigit()])")
    assert result.passed and len(json.loads(result.stdout.replace("'", '"'))) <= 3


def test_signals_cannot_reach_the_parent() -> None:
    result = run(f"""
        import os
        try:
            os.kill({os.getpid()}, 0)
            print("reached")
        except ProcessLookupError:
            print("not found")
    """)
    assert result.stdout.strip() == "not found"


# --- processes ---------------------------------------------------------------------------------------------

PROCESS_ESCAPES = {
    "os.fork": "import os; os.fork()",
    "posix re-imported": "import sys; sys.modules.pop('posix', None); import posix; posix.fork()",
    "subprocess": "import subprocess; subprocess.run(['/bin/true'])",
    "os.system": "import os; assert os.system('true') == 0",
    "multiprocessing": "import multiprocessing as mp; p = mp.Process(target=print); p.start(); p.join()",
    "thread": "import threading; t = threading.Thread(target=print); t.start(); t.join()",
    "ctypes clone syscall": "import ctypes; assert ctypes.CDLL(None).syscall(56, 17, 0, 0, 0, 0) >= 0",
    "ctypes unshare": "import ctypes; assert ctypes.CDLL(None).unshare(0x10000000) == 0",
    "ctypes ptrace": "import ctypes; assert ctypes.CDLL(None).ptrace(16, 1, 0, 0) == 0",
    "ctypes mount": "import ctypes; assert ctypes.CDLL(None).mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0",
}


@pytest.mark.parametrize("program", list(PROCESS_ESCAPES.values()), ids=list(PROCESS_ESCAPES))
def test_no_process_thread_or_namespace_can_be_made(program: str) -> None:
    result = run(program + "\n")
    assert not result.passed


def test_nothing_outlives_the_run() -> None:
    before = exitbench_temp_folders()
    result = run(JAIL_IDS + textwrap.dedent("""
        import os, time
        try:
            if os.fork() == 0:
                os.setsid()
                time.sleep(60)
        except OSError:
            pass
        time.sleep(60)
    """), timeout_s=1)
    assert result.status == "timeout"
    assert host_leftovers(jail_ids(result.stdout), before) == NOTHING_LEFT


# The jail's init (bwrap, pid 1 of the jail) runs as the jail's user, so the program can write its memory
# through /proc/1/mem: this puts `prctl(PR_SET_PDEATHSIG, 0); for (;;) pause();` where init's wait returns
# (x86_64 machine code). Unchecked, init then survives the run with its namespaces and RAM-backed folders.
HIJACK_INIT = JAIL_IDS + textwrap.dedent("""
    pc = int(open("/proc/1/syscall").read().split()[-1], 16)
    code = bytes.fromhex("bf01000000" "31f6" "b89d000000" "0f05" "b822000000" "0f05" "ebf7")
    with open("/proc/1/mem", "r+b", buffering=0) as memory:
        memory.seek(pc)
        memory.write(code)
    open("/dev/shm/ballast", "wb").write(b"x" * 4_000_000)
""")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the hijack is x86_64 machine code")
@pytest.mark.parametrize("entry", ["run_program", "check_completion"])
def test_a_hijacked_init_does_not_outlive_the_run(entry: str) -> None:
    before = exitbench_temp_folders()
    if entry == "run_program":
        result = run(HIJACK_INIT, timeout_s=2)
        assert not result.passed  # init never reports the program's exit: the run times out
        output = result.stdout
    else:
        result = check_completion(PROMPT + "    return a + b\n", "\n" + HIJACK_INIT, TEST, "add", timeout_s=2)
        output = result.stderr  # the program's prints go to its stderr in a check
    assert host_leftovers(jail_ids(output), before) == NOTHING_LEFT


def test_the_die_with_parent_signal_cannot_be_dropped() -> None:
    result = run("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.prctl(1, 0, 0, 0, 0), os.strerror(ctypes.get_errno()))
    """)
    assert result.stdout.strip() == "-1 Operation not permitted"


def test_standard_streams_are_pipes_not_host_files() -> None:
    result = run("""
        import os, stat
        for fd in (0, 1, 2):
            mode = os.fstat(fd).st_mode
            print(fd, "file" if stat.S_ISREG(mode) else "pipe" if stat.S_ISFIFO(mode) else "device")
    """)
    assert result.stdout.split() == ["0", "device", "1", "pipe", "2", "pipe"]
    program = "    return a + b\nimport os, stat\nassert stat.S_ISFIFO(os.fstat(2).st_mode), 'stderr is a file'\n"
    checked = check_completion(PROMPT, program, TEST, "add")
    assert checked.passed, checked.stderr


def test_a_slow_to_decode_answer_costs_the_verifier_at_most_the_timeout() -> None:
    # 40,000 integers whose hashes collide: a set of them takes the decoder tens of seconds of CPU
    completion = textwrap.indent(textwrap.dedent("""
        import json, os, time
        items = [["i", format(k * ((1 << 61) - 1), "x")] for k in range(1, 40_001)]
        os.write(3, (json.dumps(["ok", ["S", items]]) + "\\n").encode())
        time.sleep(60)
    """), "    ")
    timeout_s = 2.0
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = check_completion(PROMPT, completion, TEST, "add", timeout_s=timeout_s)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert result.status == "timeout" and "CPU time" in result.stderr
    assert cpu <= timeout_s + 1.0


# --- network -----------------------------------------------------------------------------------------------


def test_a_server_on_the_hosts_loopback_is_unreachable() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        result = run(f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')")
        with pytest.raises(TimeoutError):
            server.accept()
    assert not result.passed


@pytest.mark.parametrize("program", [
    "import socket; socket.getaddrinfo('example.com', 80)",
    "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('8.8.8.8', 53))",
    "import urllib.request; urllib.request.urlopen('http://1.1.1.1', timeout=2)",
])
def test_no_network(program: str) -> None:
    result = run(program)
    assert not result.passed and ("Operation not permitted" in result.stderr or "gaierror" in result.stderr)


def test_no_socket_of_any_family_can_be_created() -> None:
    result = run("""
        import socket
        families = {"inet": 2, "inet6": 10, "unix": 1, "netlink": 16, "packet": 17, "vsock": 40, "alg": 38}
        for name, family in families.items():
            try:
                socket.socket(family, socket.SOCK_STREAM if family != 16 else socket.SOCK_RAW).close()
                print(name, "created")
            except PermissionError:
                print(name, "refused")
        try:
            socket.socketpair()
            print("socketpair created")
        except PermissionError:
            print("socketpair refused")
    """)
    assert result.passed, result.stderr
    assert [line.split()[1] for line in result.stdout.splitlines()] == ["refused"] * 8, result.stdout


def test_a_unix_socket_of_the_host_is_unreachable(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen()
        result = run(f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({path!r})")
    assert not result.passed


# --- resources -----------------------------------------------------------------------------------------------


def test_an_infinite_loop_times_out() -> None:
    start = time.monotonic()
    result = run("while True:\n    pass\n", timeout_s=1)
    assert result.status == "timeout" and time.monotonic() - start < 5


def test_a_sleeping_program_times_out() -> None:
    result = run("import time\ntime.sleep(30)\n", timeout_s=0.5)
    assert result.status == "timeout" and result.returncode is None


def test_a_memory_bomb_is_contained() -> None:
    result = run("x = bytearray(8 * 2**30)\n", memory_mb=256)
    assert result.status == "failed" and "MemoryError" in result.stderr


def test_huge_output_is_truncated_quickly() -> None:
    start = time.monotonic()
    result = run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", timeout_s=5, max_output_bytes=1000)
    assert len(result.stdout) <= 1000 and time.monotonic() - start < 8


def test_file_descriptors_are_limited() -> None:
    result = run("handles = [open('/dev/null') for _ in range(1000)]\n")
    assert not result.passed and "Too many open files" in result.stderr


# --- forged verdicts -----------------------------------------------------------------------------------------

PROMPT = 'def add(a, b):\n    """Return a + b."""\n'
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"

FORGERIES = {
    "exits 0 before the test": "    return 0\nimport os\nos._exit(0)\n",
    "sys.exit(0)": "    return 0\nimport sys\nsys.exit(0)\n",
    "prints a fake verdict": '    return 0\nprint(\'{"status": "passed", "detail": ""}\')\nimport os\nos._exit(0)\n',
    "writes a fake verdict to the real stdout": (
        '    return 0\nimport os\nos.write(3, b\'\\n{"status": "passed", "detail": ""}\\n\')\nos._exit(0)\n'
    ),
    "walks the frames": (
        "    return 0\nimport sys\nf = sys._getframe()\nwhile f:\n    f.f_globals.pop('check', None)\n"
        "    f = f.f_back\n"
    ),
    "patches AssertionError": "    return 0\nimport builtins\nbuiltins.AssertionError = type('X', (Exception,), {})\n",
    "returns an object equal to everything": (
        "    class Any:\n        def __eq__(self, other):\n            return True\n    return Any()\n"
    ),
    "returns an int subclass equal to everything": (
        "    class Any(int):\n        def __eq__(self, other):\n            return True\n    return Any(0)\n"
    ),
    "kills its own server mid-test": "    import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    "never answers": "    while True:\n        pass\n",
}


@pytest.mark.parametrize("completion", list(FORGERIES.values()), ids=list(FORGERIES))
def test_a_completion_cannot_forge_a_pass(completion: str) -> None:
    result = check_completion(PROMPT, completion, TEST, "add", timeout_s=3)
    assert not result.passed


def test_a_correct_completion_passes_and_a_wrong_one_fails() -> None:
    assert check_completion(PROMPT, "    print('working')\n    return a + b\n", TEST, "add").passed
    wrong = check_completion(PROMPT, "    return a - b\n", TEST, "add")
    assert wrong.status == "failed" and "AssertionError" in wrong.stderr
    assert check_completion(PROMPT, "    return (a +\n", TEST, "add").status == "failed"


def test_mbpp_checks_call_the_programs_functions_and_its_classes() -> None:
    code = textwrap.dedent("""
        import math
        class P:
            def __init__(self, x):
                self.x = x
        def area(r):
            return math.pi * r * r
        def unwrap(p):
            return p.x
        def sum(a, b):
            return a * b
    """)
    tests = ["assert math.isclose(area(1), 3.14159, rel_tol=1e-3)", "assert unwrap(P(4)) == 4", "assert sum(2, 3) == 6"]
    assert check_mbpp(code, tests).passed
    assert not check_mbpp("def area(r):\n    return r\n", tests[:1]).passed


@pytest.mark.slow
def test_every_humaneval_canonical_solution_passes_and_every_stub_fails() -> None:
    path = MIRROR / "humaneval" / "HumanEval.jsonl.gz"
    if not path.exists():
        pytest.skip(f"no data mirror at {MIRROR}")
    rows = [json.loads(line) for line in gzip.open(path, "rt")]
    failed = [r["task_id"] for r in rows if not check_completion(r["prompt"], r["canonical_solution"], r["test"],
                                                                 r["entry_point"]).passed]
    assert failed == []
    stubs = [r["task_id"] for r in rows[:20] if check_completion(r["prompt"], "    pass\n", r["test"],
                                                                 r["entry_point"]).passed]
    assert stubs == []


# --- when no jail can be built ---------------------------------------------------------------------------------


def test_without_a_jail_generated_code_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "find_bwrap", lambda: None)
    monkeypatch.delenv(sandbox.UNSANDBOXED_ENV, raising=False)
    sandbox.isolation.cache_clear()
    try:
        with pytest.raises(ExitbenchError, match=r"no bwrap binary.*EXITBENCH_ALLOW_UNSANDBOXED=1") as err:
            run_program("print(1)")
        assert "\n" not in str(err.value)
        monkeypatch.setenv(sandbox.UNSANDBOXED_ENV, "1")
        assert sandbox.isolation().mechanism == "none"
        assert run_program("print(1)").stdout == "1\n"
    finally:
        sandbox.isolation.cache_clear()


def test_a_bwrap_that_cannot_build_namespaces_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv(sandbox.BWRAP_ENV, str(fake))
    monkeypatch.delenv(sandbox.UNSANDBOXED_ENV, raising=False)
    sandbox.isolation.cache_clear()
    try:
        with pytest.raises(ExitbenchError, match=r"cannot build its namespaces.*No permissions"):
            sandbox.isolation()
    finally:
        sandbox.isolation.cache_clear()


def test_the_seccomp_filter_is_well_formed() -> None:
    program = sandbox.seccomp_filter("x86_64")
    assert program is not None and len(program) % 8 == 0
    assert sandbox.seccomp_filter("sparc") is None


@pytest.mark.parametrize("kwargs", [{"timeout_s": 0}, {"timeout_s": float("inf")}, {"memory_mb": 0},
                                    {"memory_mb": True}, {"max_output_bytes": -1}])
def test_bad_arguments_are_one_line_errors(kwargs: dict) -> None:
    with pytest.raises(ExitbenchError):
        run_program("pass", **kwargs)


def test_a_stage_with_a_code_task_fails_before_any_work_without_a_jail(monkeypatch: pytest.MonkeyPatch) -> None:
    from exitbench.tasks.base import require_isolation

    monkeypatch.setattr(sandbox, "find_bwrap", lambda: None)
    monkeypatch.delenv(sandbox.UNSANDBOXED_ENV, raising=False)
    sandbox.isolation.cache_clear()
    try:
        require_isolation(["topv2", "cnndm"])  # no generated code is run: no jail needed
        for task in ("humaneval", "mbpp"):
            with pytest.raises(ExitbenchError, match="sandbox: no bwrap binary"):
                require_isolation(["topv2", task])
    finally:
        sandbox.isolation.cache_clear()
