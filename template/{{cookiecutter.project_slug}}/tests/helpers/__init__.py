"""What several test files share: servers the tests start, and ways to compare runs."""
