# warmboxd's kernel: one persistent interpreter per code-interpreter context.
#
# Started by interp.c inside the sandbox's jail as
#   /usr/bin/python3 -c <this file> python|bash [<charts.py>]
# fd 0 carries requests from warmboxd, one JSON object a line:
#   {"op": "exec", "code": "...", "env": {"K": "V"}}   run a cell
#   {"op": "interrupt"}                                  interrupt the running cell
#   {"op": "dump"}        python: answer {"type": "__wb_dump__", "data", "unrestored"}
#   {"op": "load", "data": ..., "unrestored": {...}}     python: restore a dump
# fd 1 carries events back, one JSON object a line: exactly the NDJSON lines of
# the code interpreter's /execute stream (number_of_executions, stdout, stderr,
# result, error), then {"type": "__wb_done__"} when the cell is over. Both fds
# are moved aside at start-up: fds 1 and 2 become pipes read here, so output of
# subprocesses and C code is streamed as well.
import json
import os
import queue
import signal
import sys
import threading
import time
import codecs
from datetime import datetime, timezone

CHARTS_SRC = sys.argv[2] if len(sys.argv) > 2 else None
del sys.argv[2:]   # the cells see the argv they always saw

CTL = os.dup(0)
EVT = os.dup(1)
DIAG = os.dup(2)   # /dev/null: warmboxd gives kernels no descriptor of its own (no log)
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)

_evt_lock = threading.Lock()
_active = threading.Event()   # a cell is running: output is forwarded


def _now():
    return datetime.now(timezone.utc).isoformat()


# ---------------------------------------------------------------- children

# Children the cell's libraries wait for themselves (subprocess.Popen, and
# multiprocessing's, which go through it or record their own pid): never
# reaped here, so their return codes stay theirs.
_OWNED = set()


def _own_children():
    import subprocess
    import weakref

    orig = subprocess.Popen._execute_child

    def _execute_child(self, *a, **k):
        orig(self, *a, **k)
        pid = self.pid
        _OWNED.add(pid)
        weakref.finalize(self, _OWNED.discard, pid)

    subprocess.Popen._execute_child = _execute_child


def _owned_by_multiprocessing(pid):
    mp = sys.modules.get("multiprocessing.process")
    if mp is None:
        return False
    try:
        return any(getattr(p, "pid", None) == pid for p in list(getattr(mp, "_children", ())))
    except Exception:
        return False


def reap_strays():
    """After a cell: reap the kernel's children that exited and that nobody
    waits for (os.fork without a wait, a fork bomb): as zombies they would
    keep the sandbox at its process limit, and the next cells (bash's) could
    not start a process."""
    try:
        kids = []
        for t in os.listdir("/proc/self/task"):
            with open("/proc/self/task/%s/children" % t) as f:
                kids.extend(int(x) for x in f.read().split())
    except (OSError, ValueError):
        return
    for pid in kids:
        if pid in _OWNED or _owned_by_multiprocessing(pid):
            continue
        try:
            with open("/proc/%d/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == "Z":
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


# Characters of output per stdout/stderr line: a long write goes out as several
# lines, each well under warmboxd's longest line kept (16 MiB) and the client's
# frame limit, so a cap keeps what fits instead of losing the whole line.
TEXT_CHUNK = 262144


def emit_text(name, text):
    for i in range(0, len(text), TEXT_CHUNK):
        emit({"type": name, "text": text[i:i + TEXT_CHUNK], "timestamp": _now()})


def emit(obj):
    data = (json.dumps(obj) + "\n").encode("utf-8", "replace")
    with _evt_lock:
        view = memoryview(data)
        while view:
            try:
                n = os.write(EVT, view)
            except InterruptedError:
                continue
            except OSError:
                os._exit(0)   # warmboxd went away
            view = view[n:]


# ---------------------------------------------------------------- output

class _Stream:
    """sys.stdout/sys.stderr: chunks go out at each newline (or after 50 ms)."""

    def __init__(self, name):
        self.name = name
        self._buf = []
        self._size = 0
        self._lock = threading.RLock()
        self._since = None
        self._last = 0.0
        self.encoding = "utf-8"
        self.errors = "replace"

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        if not s:
            return 0
        with self._lock:
            self._buf.append(s)
            self._size += len(s)
            now = time.monotonic()
            if self._since is None:
                self._since = now
            # A line goes out at once after a quiet spell; a burst of lines is
            # batched (the flusher sends the rest within 50 ms).
            if s.endswith("\n") and (now - self._last > 0.05 or self._size > 65536):
                self.flush()
        return len(s)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        with self._lock:
            if not self._buf:
                return
            text = "".join(self._buf)
            self._buf = []
            self._size = 0
            self._since = None
            self._last = time.monotonic()
            if _active.is_set():
                emit_text(self.name, text)

    def due(self):
        return self._since is not None and time.monotonic() - self._since > 0.05

    def isatty(self):
        return False

    def readable(self):
        return False

    def writable(self):
        return True

    def seekable(self):
        return False

    def fileno(self):
        return 1 if self.name == "stdout" else 2

    @property
    def closed(self):
        return False


OUT = _Stream("stdout")
ERR = _Stream("stderr")


def _flusher():
    while True:
        time.sleep(0.05)
        for s in (OUT, ERR):
            if s.due():
                try:
                    s.flush()
                except Exception:
                    pass


class _FdPipe:
    """Captures a file descriptor (1 or 2) through a pipe, for subprocesses."""
    MARK = b"\x00\x01WBSYNC\x01\x00"

    def __init__(self, fd, stream):
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        self.fd = fd
        self.r = r
        self.stream = stream
        self.synced = threading.Event()
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")
        threading.Thread(target=self._run, daemon=True).start()

    def _out(self, data):
        if data:
            text = self.dec.decode(data)
            if text and _active.is_set():
                self.stream.flush()
                emit({"type": self.stream.name, "text": text, "timestamp": _now()})

    def _run(self):
        buf = b""
        mark = self.MARK
        while True:
            try:
                chunk = os.read(self.r, 65536)
            except InterruptedError:
                continue
            if not chunk:
                return
            buf += chunk
            while True:
                i = buf.find(mark)
                if i < 0:
                    break
                self._out(buf[:i])
                buf = buf[i + len(mark):]
                self.synced.set()
            # keep a tail that could be the start of a marker
            keep = 0
            for k in range(min(len(mark) - 1, len(buf)), 0, -1):
                if mark.startswith(buf[-k:]):
                    keep = k
                    break
            self._out(buf[:len(buf) - keep])
            buf = buf[len(buf) - keep:]

    def sync(self):
        """Wait until everything written to the fd so far has been emitted."""
        self.synced.clear()
        try:
            os.write(self.fd, self.MARK)
        except OSError:
            return
        self.synced.wait(2.0)


# ---------------------------------------------------------------- control

REQUESTS = queue.Queue()
_main_ident = threading.get_ident()
_running = threading.Event()


def _control():
    f = os.fdopen(CTL, "rb", buffering=0)
    buf = b""
    while True:
        try:
            chunk = f.read(65536)
        except InterruptedError:
            continue
        if not chunk:
            os._exit(0)   # warmboxd closed our control pipe
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                req = json.loads(line)
            except ValueError:
                continue
            if req.get("op") == "interrupt":
                if _running.is_set():
                    signal.pthread_kill(_main_ident, signal.SIGINT)
            else:
                REQUESTS.put(req)


def _on_sigint(signum, frame):
    # Only a running cell is interrupted; a late signal after it is ignored.
    if _running.is_set():
        raise KeyboardInterrupt


def _with_env(env):
    saved = {}
    for k, v in (env or {}).items():
        if not isinstance(k, str) or not k or "=" in k or "\0" in k:
            continue
        saved[k] = os.environ.get(k)
        os.environ[k] = str(v)
    return saved


def _restore_env(saved):
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# ---------------------------------------------------------------- python

MIME = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown",
    "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg",
    "application/pdf": "pdf", "text/latex": "latex", "application/json": "json",
    "application/javascript": "javascript", "e2b/data": "data", "e2b/graph": "graph", "e2b/chart": "chart",
}


def result_line(data, main):
    out = {"type": "result"}
    extra = {}
    for mime, value in (data or {}).items():
        if value is None:
            continue
        key = MIME.get(mime)
        if key is None:
            extra[mime] = value
            continue
        if isinstance(value, bytes):
            import base64
            value = base64.b64encode(value).decode("ascii")
        if key in ("png", "jpeg", "pdf") and isinstance(value, str):
            value = value.replace("\n", "")
        out[key] = value
    text = out.get("text")
    # as the code interpreter's Result does, for every result
    if isinstance(text, str) and text.startswith("'") and text.endswith("'"):
        out["text"] = text[1:-1]
    out["is_main_result"] = bool(main)
    out["extra"] = extra
    return fit_result(out)


# Bytes of JSON a result (or an error) line may take: well under warmboxd's
# longest kernel line kept (16 MiB) and the client's frame limit. A larger one
# keeps its text forms cut to fit, drops the forms that a cut would break
# (images, pdf, structured data, extra), and says `"truncated": true`.
RESULT_MAX = 8 << 20
_BINARY = ("png", "jpeg", "pdf", "data", "chart", "graph", "json", "extra")


def _json_len(v):
    return len(json.dumps(v).encode("utf-8", "replace"))


def _cut_text(text, room):
    """The longest prefix of `text` whose JSON form takes at most `room` bytes."""
    if room <= 2:
        return ""
    n = len(text)
    size = _json_len(text)
    while size > room and n > 0:
        # escapes make some characters longer: shrink in proportion, a little more
        n = min(n - 1, int(n * room / size * 0.99))
        size = _json_len(text[:n])
    return text[:n]


def fit_result(out, limit=RESULT_MAX):
    if _json_len(out) <= limit:
        return out
    fitted = {k: v for k, v in out.items() if not isinstance(v, str) and k not in _BINARY}
    fitted["extra"] = {}
    fitted["truncated"] = True
    room = limit - _json_len(fitted) - 64
    for k, v in out.items():
        if k in fitted or k in _BINARY:
            continue
        if isinstance(v, str):
            cut = _cut_text(v, room - len(k) - 4)
            fitted[k] = cut
            room -= _json_len(cut) + len(k) + 4
    return fitted


# ---------------------------------------------------------------- start-up
# What E2B's code-interpreter template adds to every Python kernel at start-up
# (its startup_scripts): the `e2b/data` form of a pandas DataFrame (the SDK's
# `result.data`) and images as results when a PIL image is saved to a path or
# shown, and the `e2b/chart` form of a matplotlib figure (charts.py). The
# inline backend displays a shown figure, and every figure still open at the
# end of a cell (a saved one, say), as png. pandas and PIL are optional: nothing is imported here
# that the cell did not import itself (PIL's modules are patched as a cell
# imports them).


def _json_value(v):
    """A DataFrame cell as JSON can carry it: timestamps as ISO text, NaN
    and infinities as null (JSON has neither), other objects as their text."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    iso = getattr(v, "isoformat", None)
    if callable(iso):
        try:
            return iso()
        except Exception:
            pass
    item = getattr(v, "item", None)   # numpy scalars
    if callable(item):
        try:
            return _json_value(item())
        except Exception:
            pass
    return str(v)


def _install_e2b_formatters(shell):
    from IPython.core.formatters import BaseFormatter
    from traitlets import Unicode, ObjectName

    class E2BDataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict, str)

        def __call__(self, obj):
            # a DataFrame exists only if the cell imported pandas
            pandas = sys.modules.get("pandas")
            if pandas is None or not isinstance(obj, pandas.DataFrame):
                return super().__call__(obj)
            data = obj.to_dict(orient="list")
            return {str(k): [_json_value(v) for v in col] for k, col in data.items()}

    formatter = shell.display_formatter
    formatter.formatters["e2b/data"] = E2BDataFormatter(parent=formatter)


def _install_charts(shell):
    """charts.py (its source is this kernel's third argument): the
    `e2b/chart` form of a matplotlib figure."""
    if CHARTS_SRC:
        import types
        mod = types.ModuleType("_warmbox_charts")
        exec(compile(CHARTS_SRC, "<warmbox charts>", "exec"), mod.__dict__)
        mod.install(shell)


class _AfterImport:
    """A meta path finder that runs hook(module) right after `name` is first
    imported (it wraps that module's loader), so nothing is imported before a
    cell asks for it."""

    def __init__(self, name, hook):
        self.name = name
        self.hook = hook
        self.busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self.busy:
            return None
        import importlib.util
        self.busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        loader = spec and spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module, hook = loader.exec_module, self.hook

        def run_then_hook(module):
            exec_module(module)
            try:
                hook(module)
            except Exception:   # a start-up extra must never break an import
                pass

        loader.exec_module = run_then_hook
        return spec


def _hook_pil_image(Image):
    from IPython.display import display
    original_save = Image.Image.save

    def save(image, fp, format=None, **params):
        if isinstance(fp, str):
            display(image)   # saved to a path: also a png result, as E2B does
        return original_save(image, fp, format, **params)

    save.__doc__ = original_save.__doc__
    Image.Image.save = save


def _hook_pil_imageshow(ImageShow):
    def show_file(self, path, **options):
        return 0   # no viewer in a sandbox: nothing to start

    for name in ("UnixViewer", "Viewer"):
        viewer = getattr(ImageShow, name, None)
        if viewer is not None and hasattr(viewer, "show_file"):
            viewer.show_file = show_file
    # image.show(): displayed, through the IPython viewer PIL registers when
    # it finds IPython (first in line here)
    ipv = getattr(ImageShow, "IPythonViewer", None)
    if ipv is not None:
        ImageShow.register(ipv, 0)


def _install_image_hooks():
    # PIL is optional and imported only by the cells that use it
    sys.meta_path.insert(0, _AfterImport("PIL.Image", _hook_pil_image))
    sys.meta_path.insert(0, _AfterImport("PIL.ImageShow", _hook_pil_imageshow))


class Run:
    error_sent = False


RUN = Run()


def error_line(name, value, traceback):
    if RUN.error_sent:
        return
    RUN.error_sent = True
    OUT.flush()
    ERR.flush()
    emit(fit_result({"type": "error", "name": name, "value": value, "traceback": traceback}))


_HIDDEN = ("In", "Out", "get_ipython", "exit", "quit")
_DUMP_MAX = 9 << 20   # 12 MiB once in base64


def _live_kind(v):
    """What a value holds that lives outside memory (dill would pickle an open
    file as a path to reopen): such a value is reported, not carried."""
    import io
    import socket
    import threading
    for t, what in ((io.IOBase, "an open file"), (socket.socket, "a socket"), (threading.Thread, "a thread")):
        if isinstance(v, t):
            return what
    return None


def _dump_namespace(ns):
    """The user's names serialised one by one with dill: what cannot be is
    listed with the reason, never silently dropped (snapshots, forks)."""
    import base64
    import dill
    names, unrestored, size = {}, {}, 0
    for k, v in list(ns.items()):
        if k.startswith("_") or k in _HIDDEN or k == "warmbox_unrestored":
            continue
        live = _live_kind(v)
        if live:
            unrestored[k] = "not carried: " + live
            continue
        try:
            if type(v).__name__ == "module":
                names[k] = ("module", v.__name__)
            else:
                names[k] = ("value", dill.dumps(v, recurse=True))
        except BaseException as e:
            unrestored[k] = "%s: %s" % (type(e).__name__, e)
            continue
        size += len(names[k][1])
        if size > _DUMP_MAX:   # warmboxd keeps kernel lines up to 16 MiB
            del names[k]
            unrestored[k] = "not carried: the dump would exceed 12 MiB"
    return {"data": base64.b64encode(dill.dumps(names)).decode("ascii"), "unrestored": unrestored}


def _load_namespace(ns, req):
    import base64
    import importlib
    import dill
    unrestored = dict(req.get("unrestored") or {})
    names = dill.loads(base64.b64decode(req["data"])) if req.get("data") else {}
    for k, (kind, v) in names.items():
        try:
            ns[k] = importlib.import_module(v) if kind == "module" else dill.loads(v)
        except BaseException as e:
            unrestored[k] = "%s: %s" % (type(e).__name__, e)
    ns["warmbox_unrestored"] = unrestored


def _namespace_op(shell, req):
    if req["op"] == "load":
        try:
            _load_namespace(shell.user_ns, req)
        except BaseException as e:
            shell.user_ns["warmbox_unrestored"] = {"*": "%s: %s" % (type(e).__name__, e)}
        return
    try:
        out = _dump_namespace(shell.user_ns)
    except BaseException as e:
        out = {"data": None, "unrestored": {"*": "%s: %s" % (type(e).__name__, e)}}
    emit(dict({"type": "__wb_dump__"}, **out))


def python_main():
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kw):
            OUT.flush()
            ERR.flush()
            emit(result_line(data, False))

        def clear_output(self, wait=False):
            pass

    class Hook(DisplayHook):
        def start_displayhook(self):
            OUT.flush()
            ERR.flush()
            self._data = None

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            self._data = format_dict

        def finish_displayhook(self):
            if self._data is not None:
                emit(result_line(self._data, True))
            self._data = None

    class Shell(InteractiveShell):
        displayhook_class = Hook
        display_pub_class = Publisher

        def _showtraceback(self, etype, evalue, stb):
            name = getattr(etype, "__name__", str(etype))
            try:
                value = str(evalue)
            except Exception:
                value = "<unprintable %s>" % name
            # joined without separators, as the code interpreter does
            error_line(name, value, "".join(stb))

        def enable_gui(self, gui=None):
            pass

    shell = Shell.instance(colors="Neutral")
    shell.history_manager.enabled = False
    for setup in (lambda: _install_e2b_formatters(shell), lambda: _install_charts(shell),
                  _install_image_hooks, _own_children):
        try:
            setup()
        except Exception:   # a start-up extra must never stop the kernel
            pass

    def finish(saved):
        _running.clear()   # first: no KeyboardInterrupt after this
        _restore_env(saved)
        try:
            OUT.flush()
            ERR.flush()
            sys.__stdout__.flush()
            sys.__stderr__.flush()
            FD1.sync()
            FD2.sync()
        finally:
            _active.clear()
            try:
                reap_strays()
            except Exception:
                pass
            emit({"type": "__wb_done__"})

    while True:
        req = REQUESTS.get()
        if req.get("op") in ("dump", "load"):
            _namespace_op(shell, req)
            continue
        _active.set()
        RUN.error_sent = False
        saved = _with_env(req.get("env"))
        try:
            try:
                emit({"type": "number_of_executions", "execution_count": shell.execution_count})
                _running.set()
                shell.run_cell(req.get("code", ""), store_history=True)
            except KeyboardInterrupt:
                error_line("KeyboardInterrupt", "", "")
            finally:
                finish(saved)
        except KeyboardInterrupt:
            # the interrupt landed between the cell and finish(): finish now
            finish(saved)


# ---------------------------------------------------------------- bash

def bash_main():
    import subprocess
    import tempfile
    import re
    import select
    status_r, status_w = os.pipe()
    os.set_inheritable(status_w, True)
    env = dict(os.environ)
    proc = [None]

    def start():
        p = subprocess.Popen(["/bin/bash", "--norc", "--noprofile"], stdin=subprocess.PIPE,
                             stdout=1, stderr=2, pass_fds=(status_w,), env=env,
                             start_new_session=False)
        p.stdin.write(b"trap 'return 130 2>/dev/null' INT\n")
        p.stdin.flush()
        proc[0] = p

    start()
    count = [1]
    ident = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
    # An interrupt only raises a flag that the wait loop below polls: an
    # exception could land anywhere between writing the cell and reading its
    # status, and end the cell with neither its status nor an error.
    intr = threading.Event()

    def on_sigint(signum, frame):
        if _running.is_set():
            intr.set()
    signal.signal(signal.SIGINT, on_sigint)

    def quote(s):
        return "'" + str(s).replace("'", "'\\''") + "'"

    while True:
        try:
            req = REQUESTS.get()
        except KeyboardInterrupt:
            continue
        RUN.done_sent = False
        try:
            _active.set()
            RUN.error_sent = False
            emit({"type": "number_of_executions", "execution_count": count[0]})
            count[0] += 1
            fd, path = tempfile.mkstemp(prefix=".wb-cell-", suffix=".sh", dir="/tmp")
            with os.fdopen(fd, "w") as f:
                f.write(req.get("code", ""))
                f.write("\n")
            pre, post = [], []
            for i, (k, v) in enumerate((req.get("env") or {}).items()):
                if not ident.match(k):
                    continue
                pre.append('if [ -n "${%s+x}" ]; then __wb_o%d="$%s"; __wb_h%d=1; else __wb_h%d=0; fi; export %s=%s'
                           % (k, i, k, i, i, k, quote(v)))
                post.append('if [ $__wb_h%d = 1 ]; then export %s="$__wb_o%d"; else unset %s; fi; unset __wb_o%d __wb_h%d'
                            % (i, k, i, k, i, i))
            script = "\n".join(["trap - INT; trap 'return 130 2>/dev/null' INT"] + pre + ["source %s; __wb_rc=$?" % quote(path)] + post
                               + ["echo $__wb_rc >&%d" % status_w, ""])
            p = proc[0]
            intr.clear()
            _running.set()
            rc = None
            try:
                p.stdin.write(script.encode())
                p.stdin.flush()
                buf = b""
                intr_at = None
                while rc is None:
                    r, _, _ = select.select([status_r], [], [], 0.2)
                    if intr.is_set():
                        intr.clear()
                        _interrupt_bash(p)
                        intr_at = intr_at or time.monotonic()
                        continue
                    if intr_at and not r and time.monotonic() - intr_at > 3:
                        # the shell does not give up the command: a new shell
                        _interrupt_bash(p, signal.SIGKILL)
                        p.wait()
                        rc = -1
                        error_line("KeyboardInterrupt", "the command did not stop; the shell was restarted", "")
                        start()
                        break
                    if r:
                        buf += os.read(status_r, 64)
                        if b"\n" in buf:
                            rc = int(buf.split(b"\n")[0] or b"1")
                    elif p.poll() is not None:
                        rc = p.returncode if p.returncode >= 0 else 128 - p.returncode
                        error_line("BashExited", "bash exited with status %d; the shell was restarted" % rc, "")
                        start()
                        break
            except (BrokenPipeError, OSError):
                rc = -1
                error_line("BashExited", "bash is not running; the shell was restarted", "")
                start()
            finally:
                _running.clear()
                try:
                    os.unlink(path)
                except OSError:
                    pass
                FD1.sync()
                FD2.sync()
                if rc not in (None, 0, -1):
                    error_line("BashError", "exit status %d" % rc, "")
                _active.clear()
                emit({"type": "__wb_done__"})
                RUN.done_sent = True
        except KeyboardInterrupt:
            # the interrupt landed after the command ended: still end the cell
            _running.clear()
            if not RUN.done_sent:
                _active.clear()
                emit({"type": "__wb_done__"})
                RUN.done_sent = True


def _interrupt_bash(p, sig=signal.SIGINT):
    """SIGINT to the shell's children (the running command), then the shell."""
    kids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == p.pid:
            kids.append(int(pid))
    for pid in kids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    try:
        os.kill(p.pid, sig)
    except OSError:
        pass


# ---------------------------------------------------------------- main

sys.stdout = OUT
sys.stderr = ERR
FD1 = _FdPipe(1, OUT)
FD2 = _FdPipe(2, ERR)
sys.__stdout__ = os.fdopen(1, "w", buffering=1, closefd=False)
sys.__stderr__ = os.fdopen(2, "w", buffering=1, closefd=False)
threading.Thread(target=_flusher, daemon=True).start()
threading.Thread(target=_control, daemon=True).start()
try:
    signal.signal(signal.SIGINT, _on_sigint)
    if len(sys.argv) > 1 and sys.argv[1] == "bash":
        bash_main()
    else:
        python_main()
except BaseException:
    import traceback
    os.write(DIAG, ("warmboxd kernel: " + traceback.format_exc()).encode("utf-8", "replace"))
    os._exit(1)
