"""warmbox's hooks in an IPython kernel: the cell guard and the output report.

The client (lua/warmbox/outputs.lua, `outputs.PRELUDE`) sends this file as one
cell of its own before a user's cell when the kernel may not have the hooks
yet, with one line appended: a call of `install` with the client's constants.
The cell is idempotent (guarded by attributes on `get_ipython()`), and it is
warmbox's: the user's next cell keeps the execution count it would have had.
"""
import base64
import mimetypes
import os
import re
import shutil


def cells_guard(ip, cells, fence, kept):
    """At most once behind an intermediary: a cell the session sends starts
    with a line naming its id (and its run's fencing number). Accepting it
    makes the directory <cells>/<id>; a session that got no answer makes that
    directory first to give the cell up, so a late copy is refused here,
    before any of it runs. Fencing: a cell whose number is lower than the
    highest this sandbox accepted (in <fence>) is refused too. The ids of the
    latest `kept` cells are kept."""
    pat = re.compile(r"^__warmbox_cell__\('([0-9a-f]{1,64})'(?:, ([0-9]{1,19}))?\)\s*$")
    seen = []

    def highest():
        try:
            with open(fence) as f:
                return int(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0

    def accept(lines):
        m = pat.match(lines[0]) if lines else None
        if m is None:
            return lines
        n, high = m.group(2) and int(m.group(2)), highest()
        if n is not None and n < high:
            raise RuntimeError('warmbox: fenced: run ' + str(n) + ' is older than run ' + str(high)
                               + ' of this sandbox; not run') from None
        os.makedirs(cells, exist_ok=True)
        try:
            os.mkdir(os.path.join(cells, m.group(1)))
        except FileExistsError:
            raise RuntimeError('warmbox: cell ' + m.group(1) + ' was given up by its session; not run') from None
        if n is not None and n > high:
            with open(fence + '.tmp', 'w') as f:
                f.write(str(n))
            os.replace(fence + '.tmp', fence)
        seen.append(m.group(1))
        while len(seen) > kept:
            try:
                os.rmdir(os.path.join(cells, seen.pop(0)))
            except OSError:
                pass
        return lines[1:]
    ip.input_transformers_cleanup.insert(0, accept)
    ip._warmbox_cells = True


def walk(out, max_files, max_depth):
    """The regular files below `out`, in the order and with the caps of the
    client's walk over envd (outputs.lua, `collect_envd`): each directory's
    entries in byte order of their names, a subdirectory's files at its
    name's place (Go's WalkDir, as envd's ListDir lists), at most `max_depth`
    levels deep (1: the files in `out` itself); links and other files that
    are not regular are skipped, never followed. Stops at `max_files` + 1
    files: the last one says the walk went past the cap (the client drops
    it). Returns [(name, path, size)], name the bytes of the path below out."""
    found = []

    def level(path, rel, depth):
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            if len(found) > max_files:
                return
            try:
                if e.is_dir(follow_symlinks=False):
                    if depth < max_depth:
                        level(e.path, rel + e.name + b'/', depth + 1)
                elif e.is_file(follow_symlinks=False):
                    found.append((rel + e.name, e.path, e.stat(follow_symlinks=False).st_size))
            except OSError:
                pass  # gone meanwhile
    level(os.fsencode(out), b'', 1)
    return found


def output_hooks(ip, out, limit, total, mime, max_files, max_depth):
    """Empties `out` before each cell; after it, displays the report of the
    files the cell left there (type `mime`): each file's name (its bytes in
    base64 too), size and MIME type, and its content when it is at most
    `limit` bytes and the report's `total` allows."""
    def reset(*_a, **_k):
        try:
            if os.path.islink(out) or os.path.isfile(out):
                os.unlink(out)
            else:
                shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out, exist_ok=True)
        except Exception:
            pass

    def report(*_a, **_k):
        files = []
        budget = total
        try:
            for rel, path, size in walk(out, max_files, max_depth):
                name = os.fsdecode(rel)
                e = {'name': name, 'size': size,
                     'name_b64': base64.b64encode(rel).decode('ascii'),
                     'mime': mimetypes.guess_type(os.path.basename(name))[0] or 'application/octet-stream'}
                if size <= limit and size <= budget and len(files) < max_files:
                    with open(path, 'rb') as f:
                        data = f.read(limit + 1)
                    if len(data) <= limit and len(data) <= budget:
                        budget -= len(data)
                        e['b64'] = base64.b64encode(data).decode('ascii')
                files.append(e)
        except Exception:
            pass
        from IPython.display import display
        display({mime: {'v': 1, 'files': files}}, raw=True)
    ip.events.register('pre_run_cell', reset)
    ip.events.register('post_run_cell', report)
    ip._warmbox_hooks = True
    reset()


def install(cells, fence, kept, out, limit, total, mime, max_files, max_depth):
    try:
        ip = __import__('IPython').get_ipython()
        if ip is None:
            return
        # this cell is warmbox's: the user's next cell keeps the number it would have had
        ip.execution_count -= 1
        if not getattr(ip, '_warmbox_cells', False):
            cells_guard(ip, cells, fence, kept)
        if not getattr(ip, '_warmbox_hooks', False):
            output_hooks(ip, out, limit, total, mime, max_files, max_depth)
    except Exception:
        pass
