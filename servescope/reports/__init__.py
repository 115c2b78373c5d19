"""Reports: documents made from saved sessions (a session's report, the compare page, their figures, the tune
report), rendered to Markdown, HTML, CSV and JSON. Reads sessions; never imported by the sessions store or the
engine."""
