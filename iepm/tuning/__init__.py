"""Tuning studies: windows × streams sweep, duration, early stop, impact, Mathis, CPU cost."""
