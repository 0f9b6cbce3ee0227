"""Flotilla drain."""
