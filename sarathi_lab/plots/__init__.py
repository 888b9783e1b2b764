"""The report's plots. Each takes the run table (see report.run_table), draws one figure, saves it
as `out.<fmt>` for each format and returns (files, the DataFrame it drew), so that what a figure
shows can be checked against the table; `plot.draw(table, ...)` returns (the figure, that
DataFrame) without saving. A plot the data cannot support raises Skip(why).

Readable with many runs (plots.lines): a line per configuration (runs that differ only in their
seeds are one, drawn as the seeds' mean with a band or error bars); lines that draw the same
numbers are drawn once, the legend naming all of them ("a = b"); past `max_lines` lines on one
axes (report option --max-lines, default 8) the figure becomes small multiples, a panel per value
of the setting that splits the lines best (the policy, the load, ...); legends sit outside the
axes; log axes carry at least three plain tick labels.

Colours: one hue per policy (vLLM red, Sarathi blue, ...), shades of it for that policy's lines.

Figures are drawn on `matplotlib.figure.Figure` objects, not through pyplot: saving them needs no
GUI backend, so nothing here selects one or keeps figures open in a global registry.

Modules: style (shared look), lines (configurations, identical lines, small multiples), cdfs,
curves (budget trade-off, load, per class), capacity, timeline, open_closed, tenants.
"""
from sarathi_lab.plots.capacity import CAPACITY_SCALES, LOG_RATIO, capacity_bars, sig
from sarathi_lab.plots.cdfs import class_cdfs, tbt_cdf, ttft_cdf
from sarathi_lab.plots.curves import (
           DIAGONAL_TOLERANCE,
           budget_tradeoff,
           class_goodput,
           diagonal_holds,
           load_curves,
)
from sarathi_lab.plots.lines import MAX_PANELS, choose_split
from sarathi_lab.plots.open_closed import open_closed
from sarathi_lab.plots.style import (
           DATA_GID,
           QUANTILES,
           Skip,
           context,
           plain_log,
           run_styles,
           save,
           series_colors,
           slug,
)
from sarathi_lab.plots.tenants import MAX_TENANT_LINES, tenant_service
from sarathi_lab.plots.timeline import timeline

_save = save   # the name the studies' analysis scripts import

__all__ = ["CAPACITY_SCALES", "DATA_GID", "DIAGONAL_TOLERANCE", "LOG_RATIO", "MAX_PANELS",
           "MAX_TENANT_LINES", "QUANTILES", "Skip", "budget_tradeoff", "capacity_bars",
           "choose_split", "class_cdfs", "class_goodput", "context", "diagonal_holds",
           "load_curves", "open_closed", "plain_log", "run_styles", "save", "series_colors",
           "sig", "slug", "tbt_cdf", "tenant_service", "timeline", "ttft_cdf"]
