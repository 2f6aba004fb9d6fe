"""dsx recipe catalogue (data only)."""
