"""Output: terminal tables, JSON, and (later) HTML reports."""
