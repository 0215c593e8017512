"""guidance."""
