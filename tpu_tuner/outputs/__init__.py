"""Rendering of measurements as Markdown reports and terminal tables."""
