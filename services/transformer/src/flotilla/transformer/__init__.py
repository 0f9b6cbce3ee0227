"""Flotilla transformer."""
