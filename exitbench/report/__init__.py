"""The report and check stages: read result files, write tables, plots and replication verdicts.

Modules: :mod:`~exitbench.report.results` (read and validate ``results/``),
:mod:`~exitbench.report.tables` (README, CSV tables, metrics.json), :mod:`~exitbench.report.plots`
(figures and plot data), :mod:`~exitbench.report.check` (published figures matched to results),
:mod:`~exitbench.report.claims` (the replication files' claims, computed with intervals),
:mod:`~exitbench.report.verdicts` (the one verdict record, rule and check.md/check.json writer),
:mod:`~exitbench.report.page` and :mod:`~exitbench.report.browser` (results/index.html, and it in Chromium).
This package reads JSON only: it never loads a model or imports torch.
"""
