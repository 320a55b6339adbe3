"""The report and check stages: read result files, write tables, plots and replication verdicts.

Modules: :mod:`~exitbench.report.results` (read and validate ``results/``),
:mod:`~exitbench.report.tables` (README, CSV tables, metrics.json), :mod:`~exitbench.report.plots`
(figures and plot data) and :mod:`~exitbench.report.check` (verdicts against ``replications/``).
This package reads JSON only: it never loads a model or imports torch.
"""
