"""Dash pages, one module each."""
