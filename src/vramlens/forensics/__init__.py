"""After the fact: what was live when (:mod:`~vramlens.forensics.live`), why an allocation ran out
of memory (:mod:`~vramlens.forensics.oom`), the view of a timeline or snapshot
(:mod:`~vramlens.forensics.view`), differences between two runs (:mod:`~vramlens.forensics.diff`)
and where a file came from (:mod:`~vramlens.forensics.sources`). Computes; never prints."""
