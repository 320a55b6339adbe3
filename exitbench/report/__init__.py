"""The report and check stages: read result files, write tables, plots and replication verdicts.

Modules: :mod:`~exitbench.report.results` (read and validate ``results/``),
:mod:`~exitbench.report.tables` (README, CSV tables, metrics.json), :mod:`~exitbench.report.plots`
(figures and plot data), :mod:`~exitbench.report.check` (verdicts against ``replications/``) and
:mod:`~exitbench.report.claims` (the replication files' claims, judged with intervals).
This package reads JSON only: it never loads a model or imports torch.
"""
