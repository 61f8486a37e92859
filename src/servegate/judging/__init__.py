"""Judging: the statistics every gate uses, apart from what is measured.

- :mod:`~servegate.judging.stats`: the geometric-mean ratio of two releases' rates, its
  Welch interval with the restart offset, outliers and tails, plans;
- :mod:`~servegate.judging.sequential`: group-sequential boundaries for the gate's looks;
- :mod:`~servegate.judging.noise`: the box's within-start noise and restart offset
  (``servegate bench noise``'s record);
- :mod:`~servegate.judging.verdict`: the bench check's rule, row by row (drift,
  outliers, what PASS means);
- :mod:`~servegate.judging.trend` and :mod:`~servegate.judging.changes`: creeping losses
  across releases and change points over the history.

What is measured (fixtures, the streaming client, result files) is
:mod:`servegate.bench`'s; running the checks during a promote is
:mod:`servegate.release`'s.
"""
