# warmboxd's chart extractor: a matplotlib figure as the code interpreter's
# `e2b/chart` result (the SDKs' `result.chart`), the shape E2B's template
# gives with its e2b_charts package:
#   {"type": "line"|"scatter"|"bar"|"pie"|"box_and_whisker"|"superchart"|"unknown",
#    "title": str|None, "elements": [...], ...}
# 2-D charts add x_label/y_label and x_unit/y_unit (the text in "(...)" or
# "[...]" of a label); line and scatter charts add x_ticks/x_tick_labels/
# x_scale and the same for y (scale: "datetime", "categorical", or
# matplotlib's own: "linear", "log", "symlog", ...), and points [x, y] with
# dates as ISO text. A figure of several axes is a "superchart" whose
# elements are the charts of its axes.
#
# Run by kernel.py (which gets this file's source as its third argument) as
# a module of its own; install(shell) registers the IPython formatter.
# Nothing here imports matplotlib: the formatter looks only at figures, and
# a figure exists only if the cell imported matplotlib itself.
import math
import re
import sys

_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def _num(v):
    """A number as JSON can carry it (NaN and infinities as null)."""
    v = float(v)
    return v if math.isfinite(v) else None


def _tidy(v):
    """A coordinate read back from matplotlib's paths and angles, without
    the float noise of its transforms: 8 significant digits less one per
    power of ten of the value (as E2B rounds), at least one."""
    v = float(v)
    if not math.isfinite(v) or v == 0:
        return v
    digits = max(1, 8 - math.floor(math.log10(abs(v))))
    return float("%.*g" % (digits, v))


def _same(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _value(v):
    """A data value of a point: dates and datetimes as ISO text, numbers as
    numbers, anything else (categories) as text."""
    import datetime
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(v, np.datetime64):
            return str(v.astype("datetime64[s]"))
        if isinstance(v, np.generic):
            v = v.item()
            if isinstance(v, (datetime.date, datetime.datetime)):
                return v.isoformat()
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return _num(v)
    if isinstance(v, str):
        return v
    return str(v)


def _text(s):
    return s if s else None


def _converter(axis):
    get = getattr(axis, "get_converter", None)
    return get() if callable(get) else getattr(axis, "converter", None)


def _is_date(converter):
    import matplotlib.dates as mdates
    kinds = tuple(getattr(mdates, n) for n in
                  ("_SwitchableDateConverter", "DateConverter", "ConciseDateConverter")
                  if hasattr(mdates, n))
    return isinstance(converter, kinds)


def _is_grid_line(line):
    """A straight horizontal or vertical segment (axhline, axvline...)."""
    x, y = line.get_xdata(), line.get_ydata()
    if len(x) != 2 or len(y) != 2:
        return False
    return x[0] == x[1] or y[0] == y[1]


# ---------------------------------------------------------------- parts

def _base(kind, ax):
    return {"type": kind, "title": _text(ax.get_title()) if ax is not None else None,
            "elements": []}


def _add_labels(chart, ax):
    for axis, label in (("x", ax.get_xlabel()), ("y", ax.get_ylabel())):
        chart[axis + "_label"] = _text(label)
    for axis in ("x", "y"):
        unit = None
        label = chart[axis + "_label"]
        if label:
            m = _UNIT.search(label)
            if m:
                unit = m.group(1) if m.group(1) is not None else m.group(2)
        chart[axis + "_unit"] = unit


def _swap_axes(chart):
    for a, b in (("x_label", "y_label"), ("x_unit", "y_unit")):
        chart[a], chart[b] = chart[b], chart[a]


def _ticks(axis, ticks):
    if _is_date(_converter(axis)):
        import matplotlib.dates as mdates
        return [mdates.num2date(t).isoformat() for t in ticks]
    return [_value(t) for t in ticks]


def _scale(axis, scale, ticks, labels):
    if _is_date(_converter(axis)):
        return "datetime"
    if scale != "linear":
        return scale
    # categories sit at 0, 1, 2... and are labelled with their names
    for i, (tick, label) in enumerate(zip(ticks, labels)):
        if not (isinstance(tick, (int, float)) and tick == i and label != str(i)):
            return "linear"
    return "categorical"


def _add_axes(chart, ax):
    for name, axis, scale in (("x", ax.xaxis, ax.get_xscale()), ("y", ax.yaxis, ax.get_yscale())):
        labels = [t.get_text() for t in axis.get_ticklabels()]
        ticks = _ticks(axis, axis.get_ticklocs())
        chart[name + "_ticks"] = ticks
        chart[name + "_tick_labels"] = labels
        chart[name + "_scale"] = _scale(axis, scale, ticks, labels)


def _planar(kind, ax):
    chart = _base(kind, ax)
    _add_labels(chart, ax)
    _add_axes(chart, ax)
    return chart


# ---------------------------------------------------------------- kinds

def _line(ax):
    chart = _planar("line", ax)
    for line in ax.get_lines():
        if _is_grid_line(line):
            continue
        label = str(line.get_label())
        if label.startswith("_child"):
            label = "Line " + label[len("_child"):]
        points = [[_value(x), _value(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]
        chart["elements"].append({"label": label, "points": points})
    return chart


def _scatter(ax):
    chart = _planar("scatter", ax)
    for coll in ax.collections:
        points = [[_value(x), _value(y)] for x, y in coll.get_offsets()]
        chart["elements"].append({"label": str(coll.get_label()), "points": points})
    return chart


def _tick_names(axis):
    """Tick position -> its label, for naming bars by where they stand."""
    return {float(t): lbl.get_text() for t, lbl in zip(axis.get_ticklocs(), axis.get_ticklabels())}


def _bar(ax):
    chart = _base("bar", ax)
    _add_labels(chart, ax)
    horizontal = False
    for container in ax.containers:
        rects = list(container)
        if not rects:
            continue
        group = str(container.get_label())
        if group.startswith("_container"):
            group = "Group " + group[len("_container"):]
        orientation = getattr(container, "orientation", None)
        if orientation is None:   # bars of one height are horizontal ones
            heights = [r.get_height() for r in rects]
            orientation = "horizontal" if all(h == heights[0] for h in heights) else "vertical"
        if orientation == "horizontal":
            horizontal = True
            names = _tick_names(ax.yaxis)
            where = [r.get_y() + r.get_height() / 2 for r in rects]
            values = [r.get_width() for r in rects]
        else:
            names = _tick_names(ax.xaxis)
            where = [r.get_x() + r.get_width() / 2 for r in rects]
            values = [r.get_height() for r in rects]
        for pos, value in zip(where, values):
            label = names.get(_tidy(pos))
            if label is None:
                label = "%g" % pos
            chart["elements"].append({"label": label, "group": group, "value": _num(value)})
    if horizontal:   # the value axis is x: name the axes as for vertical bars
        _swap_axes(chart)
    return chart


def _pie(ax):
    chart = _base("pie", ax)
    for wedge in ax.patches:
        chart["elements"].append({
            "label": str(wedge.get_label()),
            "angle": abs(_tidy(wedge.theta2 - wedge.theta1)),
            "radius": _num(wedge.r),
        })
    return chart


def _box_and_whisker(ax):
    """boxplot's artists: a box (patch) per data set from the first to the
    third quartile, a median line across it, whiskers from the box to the
    extremes and fliers (marker-only lines) for the outliers."""
    chart = _base("box_and_whisker", ax)
    _add_labels(chart, ax)
    boxes = []
    for patch in ax.patches:
        v = patch.get_path().vertices
        xs = [_tidy(x) for x in v[:, 0]]
        ys = [_tidy(y) for y in v[:, 1]]
        boxes.append({"x0": min(xs), "x1": max(xs), "y0": min(ys), "y1": max(ys)})
    if not boxes:
        return chart
    # boxes of one width stand upright (values on y); of one height lie (on x)
    vertical = all(_same(b["x1"] - b["x0"], boxes[0]["x1"] - boxes[0]["x0"]) for b in boxes)
    if not vertical:
        _swap_axes(chart)
        for b in boxes:
            b["x0"], b["x1"], b["y0"], b["y1"] = b["y0"], b["y1"], b["x0"], b["x1"]
    names = _tick_names(ax.xaxis if vertical else ax.yaxis)
    for b in boxes:
        b.update(median=None, lo=b["y0"], hi=b["y1"], outliers=[])

    def box_at(pos):
        for b in boxes:
            if b["x0"] <= pos <= b["x1"]:
                return b
        return None

    for line in ax.lines:
        xs = [_tidy(x) for x in line.get_xdata()]
        ys = [_tidy(y) for y in line.get_ydata()]
        if not vertical:
            xs, ys = ys, xs
        if not xs:
            continue
        if line.get_linestyle() in ("None", "none", "", " "):   # fliers
            b = box_at(xs[0])
            if b is not None:
                b["outliers"].extend(ys)
            continue
        if len(xs) != 2:
            continue
        b = box_at(min(xs))
        if b is None or max(xs) > b["x1"]:
            continue
        if ys[0] == ys[1]:
            if b["y0"] <= ys[0] <= b["y1"] and xs[0] != xs[1] and \
                    min(xs) <= (b["x0"] + b["x1"]) / 2 <= max(xs) and \
                    (max(xs) - min(xs)) >= (b["x1"] - b["x0"]) * 0.99:
                b["median"] = ys[0]   # a line across the whole box
            continue
        lo, hi = min(ys), max(ys)
        if hi == b["y0"]:
            b["lo"] = lo
        elif lo == b["y1"]:
            b["hi"] = hi
    for b in boxes:
        label = names.get(_tidy((b["x0"] + b["x1"]) / 2))
        chart["elements"].append({
            "label": label if label is not None else "",
            "min": b["lo"],
            "first_quartile": b["y0"],
            "median": b["median"],
            "third_quartile": b["y1"],
            "max": b["hi"],
            "outliers": b["outliers"],
        })
    return chart


def _kind(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge
    from matplotlib.text import Text
    children = getattr(ax, "_children", None)
    if children is None:
        children = ax.get_children()
    objs = [o for o in children if not isinstance(o, Text)]
    if all(isinstance(o, Line2D) for o in objs):
        return "line"
    if all(isinstance(o, (PathPatch, Line2D)) for o in objs):
        return "box_and_whisker"
    objs = [o for o in objs if not (isinstance(o, Line2D) and _is_grid_line(o))]
    for kind, cls in (("scatter", PathCollection), ("pie", Wedge), ("bar", Rectangle)):
        if all(isinstance(o, cls) for o in objs):
            return kind
    return "unknown"


_KINDS = {"line": _line, "scatter": _scatter, "bar": _bar, "pie": _pie,
          "box_and_whisker": _box_and_whisker}


def axes_chart(ax):
    kind = _kind(ax)
    make = _KINDS.get(kind)
    return make(ax) if make else _base("unknown", ax)


def figure_chart(fig):
    """The chart of a figure, or None for a figure without data."""
    axes = fig.get_axes()
    if not any(ax.has_data() for ax in axes):
        return None
    if len(axes) == 1:
        return axes_chart(axes[0])
    sup = getattr(fig, "_suptitle", None)
    return {"type": "superchart", "title": _text(sup.get_text()) if sup is not None else None,
            "elements": [axes_chart(ax) for ax in axes]}


def install(shell):
    from IPython.core.formatters import BaseFormatter
    from traitlets import Unicode, ObjectName

    class E2BChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict, str)

        def __call__(self, obj):
            # a figure exists only if the cell imported matplotlib
            mpl_figure = sys.modules.get("matplotlib.figure")
            if mpl_figure is None or not isinstance(obj, mpl_figure.Figure):
                return super().__call__(obj)
            try:
                return figure_chart(obj)
            except Exception:   # a figure we cannot read still shows as png
                return None

    formatter = shell.display_formatter
    formatter.formatters["e2b/chart"] = E2BChartFormatter(parent=formatter)
