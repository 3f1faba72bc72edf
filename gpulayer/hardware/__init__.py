"""Facts about machines that every part reads alike: GPU models and what their tools print.
Pure, no I/O: the worker's probe, the scheduler, offers and providers all use it."""
