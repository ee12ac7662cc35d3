"""Groupwise grading: shared workspaces, graders, and the host-side grader loop."""
