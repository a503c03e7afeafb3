"""JSON schemas validating configs before anything runs."""
