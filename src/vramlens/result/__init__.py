"""What every engine returns: :class:`~vramlens.result.report.MemoryReport` (levels, phases, terms)
and :class:`~vramlens.result.timeline.Timeline` (tensor-level events). Only the vocabulary below
(categories, workload, resolved framework profiles) is imported here; renderers live in
:mod:`vramlens.report` and the consumers' own ``render`` packages."""
