# thp-never: one knob, transparent hugepages off (no khugepaged collapses, no defrag stalls).
DESCRIPTION="transparent_hugepage = never"
THP="never"
