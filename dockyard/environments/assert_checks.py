"""An ``assert`` case of the code environment, with the checks and the program in two processes.

Inside one interpreter nothing is hidden from the program: it can walk its callers' frames for
the exit status that means "passed" (and leave with it), or return an ``int`` subclass whose
``__eq__`` is always true, and the checks' own ``==`` believes it. So (issue 41):

- the *checker* (:data:`CHECKER`, trusted, stdlib only) reads the status and the checks from
  stdin (no file the program can read; the pipe is drained before the program starts), makes
  itself non-dumpable (a process of the same uid then cannot read its ``/proc`` memory or
  descriptors; ``ptrace`` is refused by the sandbox's seccomp filter), and starts
- the *host* (:data:`HOST`), a fresh interpreter that imports the program and answers calls.

The checks run in the checker with every public name of the program bound to a proxy: a call
travels to the host as the ``repr`` of its arguments and comes back as the ``repr`` of a value
built of exact builtin types only, which the checker reads with ``ast.literal_eval`` (no code
runs, no class of the program's crosses over: an always-equal ``int`` subclass is refused).
Only a checker that reaches the end of the checks exits with the status. Checks that pass
something that is no literal (a lambda) or get something back that is none (an instance of the
program's class) fail: this harness is for MBPP-style functions of plain values.
"""

from __future__ import annotations

CHECKER = """\
import ast, ctypes, os, subprocess, sys

PR_SET_DUMPABLE = 4
LIMIT = 16 * 1024 * 1024


def _fail(reason):
    sys.stderr.write("dockyard-harness: " + reason + "\\n")
    sys.stderr.flush()
    os._exit(1)


def _read(fd):
    header = b""
    while len(header) < 8:
        chunk = os.read(fd, 8 - len(header))
        if not chunk:
            _fail("the program exited before its checks ran")
        header += chunk
    size = int(header)
    if size > LIMIT:
        _fail("the program answered more than the harness reads")
    data = b""
    while len(data) < size:
        chunk = os.read(fd, min(size - len(data), 1 << 20))
        if not chunk:
            _fail("the program exited before its checks ran")
        data += chunk
    return data.decode("utf-8", "replace")


def _write(fd, text):
    data = text.encode()
    data = b"%08d" % len(data) + data
    while data:
        data = data[os.write(fd, data):]


def main():
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    status = int(sys.stdin.readline())
    checks = sys.stdin.read()
    sys.stdin.close()
    to_host, host_in = os.pipe()
    host_out, from_host = os.pipe()
    host = subprocess.Popen(
        [sys.executable, "-I", "host.py", str(to_host), str(from_host)],
        stdin=subprocess.DEVNULL,
        pass_fds=(to_host, from_host),
    )
    os.close(to_host)
    os.close(from_host)

    def ask(request):
        _write(host_in, repr(request))
        kind, value = ast.literal_eval(_read(host_out))
        if kind == "error":
            raise RuntimeError("the program raised " + value)
        if kind != "value":
            raise TypeError("the program answered " + str(value)[:200])
        return value

    def proxy(name):
        def call(*args, **kwargs):
            for argument in (args, kwargs):
                if ast.literal_eval(repr(argument)) != argument:
                    raise TypeError("a check passes what is no literal")
            return ask(("call", name, args, kwargs))
        call.__name__ = name
        return call

    namespace = {"__name__": "checks"}
    for name, kind in ask(("names",)):
        namespace[name] = proxy(name) if kind == "callable" else ask(("get", name))
    exec(compile(checks, "checks.py", "exec"), namespace)
    host.kill()
    sys.stdout.flush()
    os._exit(status)


main()
"""

HOST = '''\
import ast, os, sys

LIMIT = 16 * 1024 * 1024
PLAIN = (int, float, complex, str, bytes, bool, type(None))


def _read(fd):
    header = b""
    while len(header) < 8:
        chunk = os.read(fd, 8 - len(header))
        if not chunk:
            os._exit(0)
        header += chunk
    size = int(header)
    data = b""
    while len(data) < size:
        chunk = os.read(fd, min(size - len(data), 1 << 20))
        if not chunk:
            os._exit(0)
        data += chunk
    return data.decode()


def _write(fd, text):
    data = text.encode()
    data = b"%08d" % len(data) + data
    while data:
        data = data[os.write(fd, data):]


def _plain(value, depth=0):
    """Whether value is built of exact builtin types only (so its repr reads back as itself)."""
    if depth > 100:
        return False
    kind = type(value)
    if kind in PLAIN:
        return kind is not float or value == value and value not in (float("inf"), -float("inf"))
    if kind in (list, tuple, set, frozenset):
        return all(_plain(item, depth + 1) for item in value)
    if kind is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


def main():
    requests, answers = int(sys.argv[1]), int(sys.argv[2])
    sys.path.insert(0, os.getcwd())
    import solution

    while True:
        request = ast.literal_eval(_read(requests))
        try:
            if request[0] == "names":
                names = [
                    (name, "callable" if callable(value) else "value")
                    for name, value in vars(solution).items()
                    if not name.startswith("_") and (callable(value) or _plain(value))
                ]
                answer = ("value", names)
            elif request[0] == "get":
                answer = ("value", getattr(solution, request[1]))
            else:
                _, name, args, kwargs = request
                answer = ("value", getattr(solution, name)(*args, **kwargs))
            if not _plain(answer[1]):
                answer = ("unsupported", type(answer[1]).__name__)
        except Exception as error:
            answer = ("error", type(error).__name__ + ": " + str(error)[:200])
        _write(answers, repr(answer))


main()
'''
