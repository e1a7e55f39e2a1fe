"""Test data for tests, benches and notebooks: generated, never results."""
