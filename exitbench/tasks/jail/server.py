# ruff: noqa: F821  (encode, decode, dumps and the codec errors come from codec.py, prepended at run time)
# Runs INSIDE the jail: execute the generated program once, then answer calls of its functions.
# Protocol on the original stdout (the program's own prints are moved to stderr): first ["ready"] or
# ["crash", type, message]; then, per request line ["call", name, args, kwargs], one line ["ok", value]
# or ["raise", type, message]. Nothing here decides pass or fail: the verifier, outside, does.
import builtins
import os
import sys
import traceback


def main():
    reply = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    requests = sys.stdin
    namespace = {"__name__": "__exitbench_program__", "__builtins__": builtins}
    objects = []  # results that are not plain data stay here; the verifier holds references

    def send(message):
        reply.write(dumps(message))
        reply.flush()

    try:
        with open(sys.argv[1], encoding="utf-8") as handle:
            source = handle.read()
        exec(compile(source, "program.py", "exec"), namespace)
    except BaseException as err:
        traceback.print_exc()
        send(["crash", type(err).__name__, str(err)[:500]])
        return
    send(["ready"])
    for line in requests:
        try:
            _, name, args, kwargs = __import__("json").loads(line)
            function = namespace.get(name)
            if not callable(function):
                raise NameError(f"name {name!r} is not defined by the program")
            result = encode(function(*decode(args, 0, objects), **decode(kwargs, 0, objects)), 0, objects)
        except BaseException as err:
            send(["raise", type(err).__name__, str(err)[:500]])
        else:
            send(["ok", result])


main()
