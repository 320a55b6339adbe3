# ruff: noqa: F821  (encode, decode, dumps and the codec errors come from codec.py, prepended at run time)
# Runs OUTSIDE the jail, with trusted code only (the dataset's prompt helpers and tests): starts the jailed
# server, and runs the test with each function of the program replaced by a stub that asks the server.
# The verdict is this process's last stdout line; the jailed program can reach neither this process nor
# that line, so it can fail its test but never forge a pass (exiting early, printing "passed", or editing
# frames all leave the test unfinished here).
import ast
import builtins
import importlib
import json
import os
import resource
import select
import subprocess
import sys
import threading
import time
import traceback

MAX_LINE_BYTES = 8 * 2**20


class JailTimeout(Exception):
    pass


class JailGone(Exception):
    pass


class Channel:
    """Line protocol with the jailed server, every read bounded by the run's deadline."""

    def __init__(self, proc, deadline):
        self.proc = proc
        self.deadline = deadline
        self.buffer = b""

    def send(self, message):
        try:
            self.proc.stdin.write(dumps(message).encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise JailGone("the program's process ended") from None

    def receive(self):
        stream = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise JailTimeout()
            ready, _, _ = select.select([stream], [], [], left)
            if not ready:
                raise JailTimeout()
            chunk = os.read(stream, 65536)
            if not chunk:
                raise JailGone("the program's process ended before answering")
            self.buffer += chunk
            if len(self.buffer) > MAX_LINE_BYTES:
                raise JailGone("the program sent an oversized answer")
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except ValueError:
            raise JailGone("the program sent a malformed answer") from None
        if not isinstance(message, list) or not message or not isinstance(message[0], str):
            raise JailGone("the program sent a malformed answer")
        return message


def exception_type(name):
    found = getattr(builtins, name, None)
    if isinstance(found, type) and issubclass(found, Exception):
        return found
    return RuntimeError


def remote_function(channel, name):
    def call(*args, **kwargs):
        channel.send(["call", name, encode(args), encode(kwargs)])
        reply = channel.receive()
        if reply[0] == "ok" and len(reply) == 2:
            return decode(reply[1])
        if reply[0] == "raise" and len(reply) == 3:
            raise exception_type(str(reply[1]))(str(reply[2]))
        raise JailGone("the program sent a malformed answer")

    call.__name__ = name
    return call


def top_level_names(source):
    """Names the program defines at its top level (it may shadow builtins); none if it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def free_names(source):
    """(names called as functions, other names read) that ``source`` uses without defining them."""
    tree = ast.parse(source)
    defined = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    defined |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).partition(".")[0] for a in node.names}
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    builtin = set(dir(builtins))
    return called - defined - builtin, read - called - defined - builtin


def free_names_any(source):
    """Every name ``source`` calls as a function (builtins included: the program may redefine them)."""
    tree = ast.parse(source)
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def load_prompt(prompt, namespace):
    """The dataset prompt's imports and helper functions (trusted); its unfinished last function gets a
    ``pass`` body when it has no docstring to stand as one."""
    for source in (prompt, prompt + "    pass\n"):
        try:
            code = compile(source, "prompt", "exec")
        except SyntaxError:
            continue
        exec(code, namespace)
        return


def run_test(spec, channel):
    namespace = {"__name__": "__exitbench_test__"}
    if spec["kind"] == "humaneval":
        load_prompt(spec["prompt"], namespace)
        exec(compile(spec["test"], "test", "exec"), namespace)
        candidate = remote_function(channel, spec["entry_point"])
        namespace[spec["entry_point"]] = candidate  # tests may call it by name, as the program would
        namespace["check"](candidate)
        return
    exec(compile(spec["setup"], "setup", "exec"), namespace)
    test = "\n".join(spec["test_list"])
    called, read = free_names(test)
    defined = top_level_names(spec["program"])
    for name in sorted((called - set(namespace)) | (defined & free_names_any(test) - set(namespace))):
        namespace[name] = remote_function(channel, name)
    for name in sorted(read - set(namespace)):  # a module the program imported for the test (math, ...)
        try:
            namespace[name] = importlib.import_module(name)
        except ImportError:
            pass
    exec(compile(test, "test", "exec"), namespace)


def set_limits(spec):
    def apply():  # the jail's limits, never above this process's own hard limits (which it cannot raise)
        for kind, soft, hard in spec["limits"]:
            ceiling = resource.getrlimit(kind)[1]
            if ceiling != resource.RLIM_INFINITY:
                soft, hard = min(soft, ceiling), min(hard, ceiling)
            resource.setrlimit(kind, (soft, hard))
    return apply


def drain(stream, path, max_bytes):
    """Copy the jail's stderr pipe into ``path`` (a file of this process's, never handed to the jail): the
    first ``max_bytes``; the rest is read and dropped so that the program never blocks on it."""
    kept = 0
    with open(path, "wb") as out:
        while True:
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                return
            piece = chunk[: max(0, max_bytes - kept)]
            out.write(piece)
            kept += len(piece)


def main():
    spec = json.load(sys.stdin)
    verdict = {"status": "error", "detail": ""}
    deadline = time.monotonic() + spec["timeout_s"]
    fds = {name: os.open(path, os.O_RDONLY) for name, path in spec["open_fds"].items()}
    fds.update({name: os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                for name, path in spec.get("write_fds", {}).items()})
    argv = [str(fds[a[1:-1]]) if a[1:-1] in fds and a[0] == "{" else a for a in spec["jail"]]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/",
        env={}, close_fds=True, preexec_fn=set_limits(spec), pass_fds=tuple(fds.values()),
    )
    for fd in fds.values():
        os.close(fd)
    reader = threading.Thread(target=drain, args=(proc.stderr, spec["stderr_path"], spec["max_stderr_bytes"]),
                              daemon=True)
    reader.start()
    channel = Channel(proc, deadline)
    try:
        first = channel.receive()
        if first[0] != "ready":
            verdict = {"status": "failed", "detail": "the program did not load: " + " ".join(map(str, first[1:]))}
        else:
            run_test(spec, channel)
            verdict = {"status": "passed", "detail": ""}
    except JailTimeout:
        verdict = {"status": "timeout", "detail": "wall-clock timeout"}
    except JailGone as err:
        verdict = {"status": "failed", "detail": str(err)}
    except Exception:
        verdict = {"status": "failed", "detail": traceback.format_exc(limit=3)[-2000:]}
    finally:
        proc.kill()
        proc.wait()
        reader.join(timeout=1.0)  # the pipe closes when the jail is gone (the parent reaps what is left)
    sys.stdout.write("\n" + json.dumps(verdict) + "\n")
    sys.stdout.flush()


main()
