"""The sweep: `SweepSpec` (spec.py, what to run), planning cells, running them against a target, server
lifecycle and telemetry, persisting each finished cell through the session store. Headless: never imports
Textual. Consumers (the CLI, the app, the tests) read one stream of events from `run_sweep()`."""
