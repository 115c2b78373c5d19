"""The command-line front end: `run` and `resume` (run.py), `sessions | compare | report | import`
(compare.py), and the helpers they share (common.py). Nothing heavy is imported at module level."""
