"""The admission pass in stages, one job each (docs/scheduling.md, "The admission pass in
stages"), as Kueue's scheduler reads: the heads in queue order (`heads`), flavor
assignment (`flavors`), quota fit and borrowing (`quota`), node fit and topology
(`nodes`, with the reservation of rule A9 in `reservation`), preemption targets
(`preempt`), admit (`admit`). `pipeline` runs one job through them on one GPU type;
`state` is what a pass carries from job to job; `waits` says why a job waits.
`policy/admission.py::plan_admissions` is the entry point."""
