"""fields."""
