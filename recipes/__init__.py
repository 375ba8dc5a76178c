"""What made the shipped models: scripts run from the repository root, never installed (recipes/README.md)."""
