"""The workload resolved once, before any engine runs: the framework profile
(:mod:`~vramlens.resolve.frameworks`), the attention kernel (:mod:`~vramlens.resolve.attention`),
the family's code style (:mod:`~vramlens.resolve.styles`), k-bit preparation
(:mod:`~vramlens.resolve.kbit`) and the derived quantities of a training step
(:class:`~vramlens.resolve.context.TrainingContext`). The estimator and the simulator both read
these records, so the two engines cannot resolve a setting differently."""
